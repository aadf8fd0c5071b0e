"""A fresh server for one run: started in its own cgroup and healthy, or ArmFailed.

The server starts on a free port with the arm's quota and environment (on this
host, or in a container of the variant's image) and the runner waits for its
/health. A port taken between choosing it and the server binding it is retried;
a server that never answers is stopped and the run fails with its log's tail.
"""

import logging
import os
import signal
from pathlib import Path

from serving_study.config.records import Arm, ClientSettings, ServerSettings, Variant
from serving_study.measure.arm_server import (
    arm_environment,
    server_argv,
    sglang_platform,
    shared_compile_cache,
)
from serving_study.measure.run_failure import ArmFailed, FailedOutsideTheArm
from serving_study.measure.run_outputs import RunPaths
from serving_study.measure.run_timeline import RunTimeline
from serving_study.measure.server_queries import ServerNeverHealthy, wait_until_healthy
from serving_study.servers.container_commands import (
    container_options,
    read_image_id,
)
from serving_study.servers.container_runtime import ContainerServer
from serving_study.servers.environment import server_environment
from serving_study.servers.local_runtime import LocalServer, free_port
from serving_study.servers.sglang_commands import SGLANG_STOP_SIGNAL, model_mount

log = logging.getLogger(__name__)

PORT_ATTEMPTS = 3


def new_server(
    server_settings: ServerSettings,
    argv: list[str],
    arm: Arm,
    name: str,
    paths: RunPaths,
    client: ClientSettings,
    workload_manifest: Path | None,
    variant: Variant | None = None,
) -> LocalServer | ContainerServer:
    """The server of one attempt: on this host, or in a container of its image.

    A container gets the arm's environment and nothing of the host's.
    """
    sglang = server_settings.engine == "sglang"
    if not server_settings.in_container:
        if sglang:
            shared_compile_cache(server_settings)
        return LocalServer(
            argv,
            server_environment(
                os.environ, arm_environment(server_settings, arm, variant)
            ),
            arm.cpu_quota,
            name,
            paths.server_log,
            quota_during_startup=client.quota_during_startup,
            quota_scope=arm.quota_scope,
            terminate_leader_only=sglang,
            stop_signal=SGLANG_STOP_SIGNAL if sglang else signal.SIGTERM,
        )
    mounts, writable_mounts = [], []
    if sglang:
        source, mounted_at, _ = model_mount(
            server_settings.sglang["model"], server_settings.model_host_path
        )
        mounts.append((source, mounted_at))
        writable_mounts.append(shared_compile_cache(server_settings))
    return ContainerServer(
        argv,
        arm_environment(server_settings, arm),
        arm.cpu_quota,
        name,
        paths.server_log,
        quota_during_startup=client.quota_during_startup,
        image=read_image_id(server_settings.image_id_file),
        runtime=server_settings.runtime,
        read_only_mounts=mounts,
        writable_mounts=writable_mounts,
        passed_environment=arm.secret_environment,
        stop_signal=SGLANG_STOP_SIGNAL.name if sglang else None,
        **container_options(
            server_settings.container,
            sglang_platform(server_settings) if sglang else None,
            arm.concurrency,
            workload_manifest,
        ),
    )


def start_healthy_server(
    server_settings: ServerSettings,
    variant: Variant,
    arm: Arm,
    group_name: str,
    paths: RunPaths,
    client: ClientSettings,
    workload_manifest: Path | None = None,
    timeline: RunTimeline | None = None,
) -> tuple[LocalServer | ContainerServer, str]:
    """Start the server on a free port and wait for /health; retry a lost port race.
    ``timeline`` gets the moments the server was launched and answered healthy."""
    timeline = timeline or RunTimeline()
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        server = new_server(
            server_settings,
            server_argv(server_settings, variant, arm, port),
            arm,
            f"{group_name}-try{attempt}",
            paths,
            client,
            workload_manifest,
            variant,
        )
        base_url = f"http://127.0.0.1:{port}"
        try:
            timeline.note("launched")
            server.start()
            wait_until_healthy(
                base_url, client.health_timeout_s, process=server.process
            )
            timeline.note("healthy")
            server.settle_after_start()
            if not client.quota_during_startup:
                server.apply_quota()
            return server, base_url
        except ServerNeverHealthy as error:
            tail = server.log_tail()
            server.stop()
            if "address already in use" in tail.lower() and attempt < PORT_ATTEMPTS:
                log.warning(
                    "port %d was taken before the server bound it; retrying", port
                )
                continue
            raise FailedOutsideTheArm(
                f"server never healthy: {error}\n{tail}"
            ) from error
        except BaseException:
            # Interrupted while starting (e.g. SIGTERM): the caller never gets
            # this server, so it must not outlive this function.
            server.stop()
            raise
    raise ArmFailed("no free port after several attempts")
