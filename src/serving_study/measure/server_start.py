"""A fresh server for one run: its launch plan started healthy, or ArmFailed.

The plan's server starts on a free port (on this host in its own cgroup, or in a
container of the variant's image) and the runner waits for its /health. A port
taken between choosing it and the server binding it is retried; a server that
never answers is stopped and the run fails with its log's tail.
"""

import logging

from serving_study.launch.plan import LaunchPlan
from serving_study.measure.run_failure import ArmFailed, FailedOutsideTheArm
from serving_study.measure.run_outputs import RunPaths
from serving_study.measure.run_timeline import RunTimeline
from serving_study.measure.server_queries import ServerNeverHealthy, wait_until_healthy
from serving_study.servers.container_runtime import ContainerServer
from serving_study.servers.local_runtime import LocalServer, free_port

log = logging.getLogger(__name__)

PORT_ATTEMPTS = 3


def new_server(
    plan: LaunchPlan, name: str, paths: RunPaths
) -> LocalServer | ContainerServer:
    """The server of one attempt: in a container of its image, or on this host."""
    runtime = ContainerServer if plan.in_container else LocalServer
    return runtime(plan, name, paths.server_log)


def start_healthy_server(
    plan: LaunchPlan,
    group_name: str,
    paths: RunPaths,
    health_timeout_s: float,
    timeline: RunTimeline | None = None,
) -> tuple[LocalServer | ContainerServer, str]:
    """Start the plan's server on a free port and wait for /health; retry a lost
    port race. ``timeline`` gets the moments it was launched and answered healthy."""
    timeline = timeline or RunTimeline()
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        server = new_server(plan.for_run(port), f"{group_name}-try{attempt}", paths)
        base_url = f"http://127.0.0.1:{port}"
        try:
            timeline.note("launched")
            server.start()
            wait_until_healthy(base_url, health_timeout_s, process=server.process)
            timeline.note("healthy")
            server.settle_after_start()
            if not plan.quota.from_start:
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
