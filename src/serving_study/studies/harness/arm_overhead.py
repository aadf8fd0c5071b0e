"""The wall time of one real embedded arm beyond its measured window, by phase.

The phases come from the engine's log milestones and the client's summary.
"""

import json
import re
import time
from datetime import datetime
from pathlib import Path

from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    ServerSettings,
    Variant,
    quota_value,
)
from serving_study.launch.engines import launch_plan
from serving_study.measure.arm_runner import run_arm
from serving_study.measure.run_outputs import RunPaths
from serving_study.measure.run_timeline import phases_between
from serving_study.studies.harness.benchmark_host import host_load_between, read_cpu

SERVER_LOG_LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \w+ [\w.]+: (.*)$"
)
# What the embedded engine logs at each step of its life, by the step's name.
SERVER_MILESTONES = {
    "main_process_ready": "loaded ShmPointerMMData",
    "scheduler_started": "scheduler process started",
    "scheduler_ready": "scheduler ready",
    "healthy": "The server is fired up",
    "stop_requested": "stop requested",
    "engine_stopped": "engine stopped",
}


def server_milestones(server_log: Path) -> dict[str, float]:
    """Epoch seconds of each milestone line in an embedded engine's log."""
    found = {}
    for line in server_log.read_text(errors="replace").splitlines():
        match = SERVER_LOG_LINE.match(line)
        if not match:
            continue
        moment, message = match.groups()
        for name, prefix in SERVER_MILESTONES.items():
            if name not in found and message.startswith(prefix):
                stamp = datetime.strptime(moment, "%Y-%m-%d %H:%M:%S,%f")
                found[name] = stamp.timestamp()
    return found


def arm_phases(
    milestones: dict[str, float], client: dict, launched: float, returned: float
) -> dict[str, float | None]:
    """Seconds spent in each phase of one arm, from launch to the runner's return."""
    t0 = client["t0_epoch"]
    moments = {
        "launched": launched,
        **milestones,
        "client_started": t0,
        "measured_started": t0 + client["measured_start_s"],
        "measured_ended": t0 + client["measured_end_s"],
        "client_ended": t0 + client["wall_seconds"],
        "runner_returned": returned,
    }
    phases = {
        "launch_to_healthy": ("launched", "healthy"),
        "main_process_start": ("launched", "main_process_ready"),
        "scheduler_start": ("scheduler_started", "scheduler_ready"),
        "server_warmup_request": ("scheduler_ready", "healthy"),
        "healthy_to_client_start": ("healthy", "client_started"),
        "client_warmup": ("client_started", "measured_started"),
        "measured_window": ("measured_started", "measured_ended"),
        "after_measured": ("measured_ended", "client_ended"),
        "teardown": ("client_ended", "runner_returned"),
        "server_shutdown": ("stop_requested", "engine_stopped"),
    }
    return phases_between(moments, phases)


def overhead_split(overhead: float | None, phases: dict | None) -> dict | None:
    """An arm's overhead as the server's start, the method's warm-up, and the rest.

    The server's start is launch to healthy: the main process's and the spawned
    scheduler's Python and torch start-up and the server's own warm-up request.
    The client's warm-up at the arm's quota is part of the method. What remains is
    the harness: noticing health, reading the workload, the monitors, teardown.
    """
    if overhead is None or not phases:
        return None
    server_start = phases.get("launch_to_healthy")
    warmup = phases.get("client_warmup")
    if server_start is None or warmup is None:
        return None
    return {
        "server_start": server_start,
        "client_warmup": warmup,
        "harness": round(overhead - server_start - warmup, 3),
    }


def measure_arm_overhead(
    *,
    arm: Arm,
    variant: Variant,
    workload_manifest: Path,
    server_settings: ServerSettings,
    client: ClientSettings,
    monitors: MonitorSettings,
    out_dir: Path,
    sharing: HostSharing | None = None,
) -> dict:
    """Run one real arm; split its wall time into the measured window and the rest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = RunPaths.in_directory(out_dir)
    before = read_cpu()
    launched = time.time()
    metrics = run_arm(
        experiment="harness-benchmark",
        arm=arm,
        run=1,
        variant=variant,
        workload_manifest=workload_manifest,
        plan=launch_plan(server_settings, arm, variant, workload_manifest),
        client=client,
        monitors=monitors,
        paths=paths,
        sharing=sharing,
    )
    returned = time.time()
    after = read_cpu()
    provenance = json.loads(paths.provenance.read_text())
    wall, measured = provenance["wall_s"], metrics["measured_seconds"]
    overhead = wall - measured if measured else None
    phases = None
    if client_summary := provenance.get("client"):
        milestones = server_milestones(paths.server_log)
        phases = arm_phases(milestones, client_summary, launched, returned)
    return {
        "arm_overhead_s": round(overhead, 3) if overhead is not None else None,
        "overhead_split_s": overhead_split(overhead, phases),
        "arm_wall_s": wall,
        "measured_seconds": measured,
        "arm": arm.name,
        "variant": variant.name,
        "cpu_quota": quota_value(arm.cpu_quota),
        "quota_timing": arm.quota_timing,
        "valid": metrics["valid"],
        "invalid_reasons": metrics["invalid_reasons"],
        "throughput_rps": metrics["throughput_rps"],
        "dispatch_lag_max_ms": metrics["dispatch_lag_max_ms"],
        "max_dispatch_lag_ms_allowed": client.max_dispatch_lag_ms,
        "phases_s": phases,
        **host_load_between(before, after),
    }
