"""The catalogue of what a run reports: each figure's name, its label for people
and its unit (METRICS), and the counts kept beside them (RUN_COUNTS).

Definitions only, on the ground floor: measuring fills these names in
(measure/run_metrics.py), the analysis summarizes them and the report labels
them, each reading the catalogue from here.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """How a run figure is named for people and what unit it carries."""

    label: str
    unit: str


# Every number a run reports. The aggregation summarizes each of them per arm,
# and the reference table of a config may name any of them.
METRICS: dict[str, Metric] = {
    "throughput_rps": Metric("throughput", "req/s"),
    "output_tokens_per_s": Metric("output tokens per second", "tok/s"),
    "ttft_p50_ms": Metric("TTFT p50", "ms"),
    "ttft_p90_ms": Metric("TTFT p90", "ms"),
    "ttft_p99_ms": Metric("TTFT p99", "ms"),
    "e2e_p50_ms": Metric("end-to-end latency p50", "ms"),
    # Per output token, as SGLang's bench_serving defines them (run_metrics.py).
    "tpot_p50_ms": Metric("TPOT p50", "ms"),
    "tpot_p90_ms": Metric("TPOT p90", "ms"),
    "tpot_p99_ms": Metric("TPOT p99", "ms"),
    "itl_p50_ms": Metric("ITL p50", "ms"),
    "itl_p90_ms": Metric("ITL p90", "ms"),
    "itl_p99_ms": Metric("ITL p99", "ms"),
    "main_cpu_percent": Metric("main-process CPU", "%"),
    "scheduler_cpu_percent": Metric("scheduler CPU", "%"),
    "cores_used": Metric("cgroup cores used", "cores"),
    "main_cpu_ms_per_request": Metric("main-process CPU per request", "ms"),
    "scheduler_cpu_ms_per_request": Metric("scheduler CPU per request", "ms"),
    "cgroup_cpu_ms_per_request": Metric("quota cgroup CPU per request", "ms"),
    "throttled_share": Metric("throttled periods", "share"),
    "throttled_seconds": Metric("throttled time", "s"),
    "main_thread_cpu_percent": Metric("main process: event-loop thread CPU", "%"),
    "other_threads_cpu_percent": Metric(
        "main process: other threads' CPU (OpenMP workers)", "%"
    ),
    "main_threads_median": Metric("main-process threads (median)", "threads"),
    "main_threads_max": Metric("main-process threads (max)", "threads"),
    "torch_threads": Metric("torch intra-op threads", "threads"),
    "gpu_util_percent": Metric("GPU utilization", "%"),
    "gpu_memory_used_mib": Metric("GPU memory used", "MiB"),
    "dispatch_lag_p99_ms": Metric("dispatch lag p99", "ms"),
    "dispatch_lag_max_ms": Metric("dispatch lag max", "ms"),
    "measured_seconds": Metric("measured window", "s"),
    # The host during the window (host_load.py): what other work used, and what a
    # virtual machine's hypervisor gave to other guests while the run wanted it.
    "host_other_cores": Metric("other work on the host", "cores"),
    "host_steal_cores": Metric("CPU taken by the hypervisor (steal)", "cores"),
}

# Counts and bookkeeping that belong to a run but are not summarized per arm.
RUN_COUNTS = (
    "requests_measured",
    "requests_completed",
    "requests_warmup",
    "error_count",
    "window_start_epoch",
    "window_end_epoch",
)
