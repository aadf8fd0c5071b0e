"""A fresh server for one run: started in its own cgroup and healthy, or ArmFailed.

The server starts on a free port with the arm's quota and environment (on this
host, or in a container of the variant's image) and the runner waits for its
/health. A port taken between choosing it and the server binding it is retried;
a server that never answers is stopped and the run fails with its log's tail.
"""

import logging
import os
from pathlib import Path

from serving_study.config.secrets import secret_names
from serving_study.measure.arm_server import (
    arm_environment,
    in_container,
    quota_cores,
    server_argv,
    sglang_platform,
    shared_compile_cache,
)
from serving_study.measure.run_failure import ArmFailed
from serving_study.measure.run_outputs import RunPaths
from serving_study.measure.server_queries import ServerNeverHealthy, wait_until_healthy
from serving_study.servers.container_commands import (
    container_options,
    read_image_id,
)
from serving_study.servers.container_runtime import ContainerServer
from serving_study.servers.environment import server_environment
from serving_study.servers.local_runtime import LocalServer, free_port
from serving_study.servers.sglang_commands import model_mount

log = logging.getLogger(__name__)

PORT_ATTEMPTS = 3


def new_server(
    engine: dict,
    argv: list[str],
    arm: dict,
    name: str,
    paths: RunPaths,
    client: dict,
    workload_manifest: Path | None,
    variant: dict | None = None,
) -> LocalServer | ContainerServer:
    """The server of one attempt: on this host, or in a container of its image.

    A container gets the arm's environment and nothing of the host's.
    """
    if not in_container(engine):
        if engine["engine"] == "sglang":
            shared_compile_cache(engine)
        return LocalServer(
            argv,
            server_environment(os.environ, arm_environment(engine, arm, variant)),
            quota_cores(arm),
            name,
            paths.server_log,
            quota_during_startup=client["quota_during_startup"],
            quota_scope=arm.get("quota_scope", "server"),
            terminate_leader_only=engine["engine"] == "sglang",
        )
    mounts, writable_mounts = [], []
    if engine["engine"] == "sglang":
        source, mounted_at, _ = model_mount(
            engine["sglang"]["model"], engine["model_host_path"]
        )
        mounts.append((source, mounted_at))
        writable_mounts.append(shared_compile_cache(engine))
    return ContainerServer(
        argv,
        arm_environment(engine, arm),
        quota_cores(arm),
        name,
        paths.server_log,
        quota_during_startup=client["quota_during_startup"],
        image=read_image_id(engine["image_id_file"]),
        runtime=engine["runtime"],
        read_only_mounts=mounts,
        writable_mounts=writable_mounts,
        passed_environment=secret_names(arm),
        **container_options(
            engine["container"],
            sglang_platform(engine) if engine["engine"] == "sglang" else None,
            arm["concurrency"],
            workload_manifest,
        ),
    )


def start_healthy_server(
    engine: dict,
    variant: dict,
    arm: dict,
    group_name: str,
    paths: RunPaths,
    client: dict,
    workload_manifest: Path | None = None,
) -> tuple[LocalServer | ContainerServer, str]:
    """Start the server on a free port and wait for /health; retry a lost port race."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        server = new_server(
            engine,
            server_argv(engine, variant, arm, port),
            arm,
            f"{group_name}-try{attempt}",
            paths,
            client,
            workload_manifest,
            variant,
        )
        base_url = f"http://127.0.0.1:{port}"
        try:
            server.start()
            wait_until_healthy(
                base_url, client["health_timeout_s"], process=server.process
            )
            server.settle_after_start()
            if not client["quota_during_startup"]:
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
            raise ArmFailed(f"server never healthy: {error}\n{tail}") from error
        except BaseException:
            # Interrupted while starting (e.g. SIGTERM): the caller never gets
            # this server, so it must not outlive this function.
            server.stop()
            raise
    raise ArmFailed("no free port after several attempts")
