"""One (arm, run): a fresh server, warm-up, the measured window, teardown, metrics.

The order matters and is the method: the server starts in its own cgroup with the
arm's quota and environment; the runner waits for /health, reads back what the
server really runs with (/server_info), sends the warm-up at the arm's concurrency,
and only then opens the monitors' window around the measured requests. Teardown
runs in ``finally`` whatever happened. A run whose server never became healthy or
died is written as a failed run (all outputs present, ``valid: false`` with the
reason) so the study goes on and the report lists it; nothing of it is averaged in.

Its parts serve other studies too (the thread x quota map runs many windows on one
server): starting the arm's launch plan (server_start.py), the measured window
(run_window.py), the run's files (run_outputs.py) and how a run ends early
(run_failure.py).
"""

import dataclasses
import logging
import os
import time
from pathlib import Path

from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    Variant,
)
from serving_study.config.secrets import redacted, require_secrets
from serving_study.launch.plan import LaunchPlan
from serving_study.measure.host_sharing import MeasurementLock
from serving_study.measure.run_failure import (
    ArmFailed,
    FailedOutsideTheArm,
    failure_reason,
    termination_as_interrupt,
)
from serving_study.measure.run_metrics import failed_run_metrics, summarize_run
from serving_study.measure.run_outputs import RunPaths, now_iso, write_json
from serving_study.measure.run_timeline import RunTimeline
from serving_study.measure.run_validity import SHM_WAS_FULL
from serving_study.measure.run_window import measure
from serving_study.measure.server_checks import server_identity, validity_checks
from serving_study.measure.server_queries import read_server_info
from serving_study.measure.server_start import start_healthy_server
from serving_study.servers.container_runtime import ContainerServer
from serving_study.servers.environment import recorded_environment
from serving_study.servers.leftovers import reap_leftovers
from serving_study.servers.local_runtime import LocalServer
from serving_study.servers.owners import owned_name

log = logging.getLogger(__name__)


@termination_as_interrupt()
def run_arm(
    *,
    experiment: str,
    arm: Arm,
    run: int,
    variant: Variant,
    workload_manifest: Path,
    plan: LaunchPlan,
    client: ClientSettings,
    monitors: MonitorSettings,
    paths: RunPaths,
    sharing: HostSharing | None = None,
    traced_to: dict | None = None,
    lock: MeasurementLock | None = None,
) -> dict:
    """Run one (arm, run) of the arm's launch ``plan`` and write all its outputs;
    return its metrics.

    ``traced_to`` goes into the run's provenance as it is: the project's commit,
    the config's hash, the host and the versions (run_provenance.py).

    The run holds the host's measurement lock (``sharing``: the config's
    ``host_sharing``, the schema's defaults when None) from before its server
    starts until it is torn down, and first removes what dead runs left. A busy
    host (lock ``fail``, or waited too long) raises HostBusy: no output, so a
    rerun measures it. Any other error fails this run only: it is recorded. A
    caller that holds the lock already (run_attempts.py: it writes the run's
    outputs under it) passes it as ``lock`` and releases it itself.
    """
    sharing = sharing or HostSharing.from_config({})
    # A secret the arm names but the runner lacks is a setup error: nothing starts.
    require_secrets(arm, os.environ)
    paths.server_log.write_text("")
    group_name = owned_name(f"{experiment}-{arm.name}-run{run}")
    # What is recorded of the arm: secret values (tokens) never reach a file.
    recorded_arm = dataclasses.replace(arm, environment=redacted(arm.environment))
    held_by_caller = lock is not None
    lock = lock or MeasurementLock.acquire(
        sharing, holder=f"experiment {experiment}, arm {arm.name}, run {run}"
    )
    # The run's time starts once it has the host (the wait is in host_lock).
    started_at, started = now_iso(), time.monotonic()
    timeline = RunTimeline()
    timeline.note("lock_taken")
    provenance = {
        "experiment": experiment,
        "arm": recorded_arm.as_config(),
        "run": run,
        "variant": variant.identity,
        "started_at": started_at,
        "host_lock": lock.record,
        **(traced_to or {}),
    }
    server = None
    inline_images = 0
    try:
        container_runtimes = (plan.container.runtime,) if plan.in_container else ()
        provenance["leftovers_reaped"] = reap_leftovers(container_runtimes).to_dict()
        server, base_url = start_healthy_server(
            plan, group_name, paths, client.health_timeout_s, timeline
        )
        provenance["start_to_healthy_s"] = round(time.monotonic() - started, 3)
        server_info = read_server_info(base_url)
        provenance.update(
            # The plan as it ran: commands/<arm>.json with this run's port.
            launch=server.plan.record(),
            runtime_argv=server.runtime_argv,
            environment_in_force=recorded_environment(
                server.environment, arm.secret_environment
            ),
            server_info=server_info,
            quota_in_force=server.group.quota_in_force(),
        )
        if isinstance(server, LocalServer):
            provenance["quota_scope"] = {
                "scope": plan.quota.scope,
                "model_processes_moved": server.moved_model_pids,
                "model_group": server.model_group.quota_in_force()
                if server.model_group
                else None,
            }
        if isinstance(server, ContainerServer):
            provenance.update(
                image=server.image,
                image_run=server.image_run,
                quota_seen_inside=server.quota_seen_inside(),
            )
        window, load_summary = measure(
            base_url,
            server,
            arm,
            plan.served_model_name,
            workload_manifest,
            client,
            monitors,
            paths,
            block=run,
        )
        if server.exit_code() is not None:
            raise ArmFailed(
                f"server exited with code {server.exit_code()} during the run\n"
                f"{server.log_tail()}"
            )
        identity = server_identity(plan, server_info, server)
        checks = validity_checks(
            plan,
            client,
            server_info,
            window,
            server,
            identity,
            sharing=sharing,
        )
        # Afterwards too: its request-path stage totals say where the main process
        # spent its time during the run.
        server_info_after = read_server_info(base_url)
        provenance["server_info_after_run"] = server_info_after
        inline_before = server_info.get("inline_fallbacks", 0)
        inline_images = server_info_after.get("inline_fallbacks", 0) - inline_before
        provenance["client"] = load_summary
        timeline.add_client(load_summary)
        write_json(paths.monitors, window)
        metrics = summarize_run(
            paths.requests, paths.monitors, recorded_arm, checks, run=run
        )
    except Exception as failure:
        # ArmFailed says why; anything else is a fault of this run alone, and the
        # study goes on (an interrupt is not an Exception: it ends the job).
        reason = failure_reason(failure, provenance)
        log.error("run failed: %s", reason)
        metrics = failed_run_metrics(
            recorded_arm,
            run,
            (reason or "?").splitlines()[0],
            outside_the_arm=isinstance(failure, FailedOutsideTheArm),
        )
        provenance["failure"] = reason
        for path in (paths.requests, paths.monitors):
            if not path.exists():
                path.write_text("" if path.suffix == ".jsonl" else "null\n")
    finally:
        try:
            if server is not None:
                timeline.note("stop_started")
                server.stop()
                timeline.note("stopped")
                provenance["leaked_segments_removed"] = server.leaked_segments
        finally:
            if not held_by_caller:
                lock.release()
    metrics.update(experiment=experiment, arm=arm.name, run=run)
    # Known only after the window and the teardown; listed beside any other reason.
    late_reasons = []
    if inline_images:
        late_reasons.append(f"{inline_images} images went inline {SHM_WAS_FULL}")
    if server is not None and server.leaked_segments:
        late_reasons.append(
            f"the server left {len(server.leaked_segments)} shared-memory segments"
        )
    if late_reasons:
        reasons = [*(metrics.get("invalid_reasons") or []), *late_reasons]
        metrics.update(valid=False, outside_the_arm=False, invalid_reasons=reasons)
    timeline.note("written")
    provenance.update(
        finished_at=now_iso(),
        wall_s=round(time.monotonic() - started, 3),
        # Where the run's time went: the server's own start apart from the harness's.
        phases_s=timeline.phases(),
    )
    write_json(paths.provenance, provenance)
    write_json(paths.metrics, metrics)
    log.info(
        "run %s/%s: valid=%s throughput=%s req/s",
        arm.name,
        run,
        metrics.get("valid"),
        metrics.get("throughput_rps"),
    )
    return metrics
