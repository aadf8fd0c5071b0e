"""Every benchmark in one run, its headline figures, and the harness's goals."""

import logging
import os
import time
from pathlib import Path

from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    ServerSettings,
    Variant,
)
from serving_study.measure.chat_requests import load_requests
from serving_study.measure.host_sharing import MeasurementLock
from serving_study.studies.harness.arm_overhead import measure_arm_overhead
from serving_study.studies.harness.benchmark_host import (
    BENCHMARK_NICENESS,
    client_and_server_cpus,
    describe_benchmark_host,
    raised_priority,
)
from serving_study.studies.harness.client_roofline import (
    measure_client_rate,
    measure_ttft_overhead,
)
from serving_study.studies.harness.dispatch_lag import check_dispatch_lag_invalidation
from serving_study.studies.harness.monitor_cost import measure_monitor_cpu
from serving_study.studies.harness.shm_copy import measure_shm_copy, summarize_shm_copy
from serving_study.studies.harness.study_wall_time import (
    default_study_wall,
    with_current_arm_overhead,
)
from serving_study.studies.harness.zero_work import zero_work_server

log = logging.getLogger(__name__)

# The goals of the harness (issues 7 and 30): each figure and the bound it must meet.
GOALS = {
    "client_headroom_ratio": (">=", 200.0),
    "client_ttft_overhead_ms_p50": ("<=", 0.1),
    "monitor_cpu_fraction": ("<=", 0.01),
    "arm_overhead_s": ("<=", 3.0),
    "shm_copy_patched_to_memcpy_ratio": (">=", 0.8),
}

# The figures the issue asks for on top, each by the part of the report it is in.
HEADLINE_FIGURES = {
    "client_max_rps": "client_rate",
    "client_headroom_ratio": "client_rate",
    "client_ttft_overhead_ms_p50": "client_ttft",
    "monitor_cpu_fraction": "monitors",
    "arm_overhead_s": "arm",
    "default_study_wall_s": "default_study",
    "shm_copy_gbps": "shm_copy",
    "memcpy_gbps": "shm_copy",
    "shm_copy_patched_to_memcpy_ratio": "shm_copy",
    "lagging_client_invalidates_run": "dispatch_lag",
}


def goals_met(figures: dict) -> dict:
    """Each goal of the harness with its figure and whether it holds."""
    verdicts = {}
    for name, (direction, bound) in GOALS.items():
        value = figures.get(name)
        met = None
        if value is not None:
            met = value >= bound if direction == ">=" else value <= bound
        verdicts[name] = {"value": value, "goal": f"{direction} {bound:g}", "met": met}
    return verdicts


def run_benchmarks(
    settings: dict,
    out_dir: Path,
    *,
    arm: Arm,
    variant: Variant,
    server_settings: ServerSettings,
    client: ClientSettings,
    monitors: MonitorSettings,
    sharing: HostSharing,
) -> dict:
    """Every benchmark, one after another, and the figures the issue asks for on top.

    `settings` holds the inputs (workload manifest, variant roots) and every size
    and duration used; the real arm runs `arm` of `variant` with the study's
    server, client and monitor settings, sharing the host as the study does.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    client_cpu, server_cpu = client_and_server_cpus()
    started = time.monotonic()
    report: dict = {"host": describe_benchmark_host(client_cpu, server_cpu)}
    chat_requests = load_requests(Path(settings["workload_manifest"]))

    # Its own servers and timings measure too: never beside another pipeline's run
    # or preparation. The real arm below takes the lock itself, as any run does.
    with MeasurementLock.acquire(sharing, "harness benchmarks"):
        with (
            raised_priority() as raised,
            zero_work_server(server_cpu, niceness=BENCHMARK_NICENESS) as server,
        ):
            report["host"]["client_and_zero_work_server_niceness"] = (
                BENCHMARK_NICENESS if raised else os.getpriority(os.PRIO_PROCESS, 0)
            )
            log.info("client rate against the zero-work server")
            report["client_rate"] = measure_client_rate(
                chat_requests,
                server,
                client_cpu=client_cpu,
                concurrencies=settings["client_concurrencies"],
                measured_requests=settings["client_measured_requests"],
                study_peak_rps=settings["study_peak_rps"],
                request_timeout_s=client.request_timeout_s,
                out_dir=out_dir,
            )
            log.info("client TTFT overhead against a raw socket")
            report["client_ttft"] = measure_ttft_overhead(
                chat_requests,
                server,
                client_cpu=client_cpu,
                requests_per_round=settings["ttft_requests_per_round"],
                rounds=settings["ttft_rounds"],
                request_timeout_s=client.request_timeout_s,
                out_dir=out_dir,
            )
            log.info("a lagging client's run")
            report["dispatch_lag"] = check_dispatch_lag_invalidation(
                chat_requests,
                server,
                block_s=settings["dispatch_block_s"],
                allowed_ms=client.max_dispatch_lag_ms,
                request_timeout_s=client.request_timeout_s,
                out_dir=out_dir / "dispatch-lag",
            )
        log.info("monitors' CPU over %s s", settings["monitor_window_s"])
        report["monitors"] = measure_monitor_cpu(
            window_s=settings["monitor_window_s"],
            threads=settings["monitor_tree_threads"],
            sample_hz=monitors.sample_hz,
            thread_sample_hz=monitors.thread_sample_hz,
            group_name=f"harness-benchmark-monitors-{os.getpid()}",
            log_path=out_dir / "monitor-tree.log",
        )
        log.info("shared-memory copies beside memcpy")
        report["shm_copy"] = summarize_shm_copy(
            measure_shm_copy(
                {name: Path(root) for name, root in settings["variant_roots"].items()},
                sorted(set(settings["shm_rows_per_image_size"].values())),
                settings["shm_columns"],
                settings["shm_repeats"],
                niceness=BENCHMARK_NICENESS,
            ),
            settings["shm_rows_per_image_size"],
        )
    log.info("one real arm")
    report["arm"] = measure_arm_overhead(
        arm=arm,
        variant=variant,
        workload_manifest=Path(settings["workload_manifest"]),
        server_settings=server_settings,
        client=client,
        monitors=monitors,
        out_dir=out_dir / "arm",
        sharing=sharing,
    )
    study_runs = [Path(directory) for directory in settings["study_run_directories"]]
    report["default_study"] = with_current_arm_overhead(
        default_study_wall(
            [Path(path) for path in settings["study_job_benchmarks"]],
            [directory / "provenance.json" for directory in study_runs],
        ),
        study_runs,
        report["arm"]["arm_overhead_s"],
    )
    report["host"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["benchmark_wall_s"] = round(time.monotonic() - started, 1)

    figures = {name: report[part][name] for name, part in HEADLINE_FIGURES.items()}
    return {**figures, "goals": goals_met(figures), **report}
