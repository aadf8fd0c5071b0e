"""The figures of one measured run, and whether the run counts.

The arm runner leaves three things per run: the client's per-request log
(`requests.jsonl`), the host-side monitors' summary (`monitors.json`) and the
checks it made while the server ran. `summarize_run` turns them into the run's
`metrics.json`: throughput, latency percentiles, CPU and GPU use, and a
validity verdict with a human-readable reason for every check that failed.
A run that never produced a log gets `failed_run_metrics` instead, so every
run of the plan has a metrics file and the report can list it.

Percentiles use linear interpolation between order statistics (numpy's
default), so the p50 of an even count is the mean of the two middle values.
"""

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


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

# Quota readings are rounded to whole microseconds per period by the kernel.
QUOTA_TOLERANCE_CORES = 0.01


def summarize_run(
    requests_path: Path,
    monitors_path: Path,
    arm: dict,
    checks: dict,
    run: int | None = None,
) -> dict:
    """Compute one run's metrics.json from its request log, monitors and checks.

    `run` is the repetition number; when omitted it is read from the name of
    the run directory (`run<k>`).
    """
    requests_path = Path(requests_path)
    monitors_path = Path(monitors_path)
    if run is None:
        run = run_number_from_directory(requests_path.parent)
    records = read_request_log(requests_path)
    monitors = read_monitors(monitors_path)

    metrics = _identity(arm, run)
    metrics.update(request_figures(records))
    metrics.update(monitor_figures(monitors))
    metrics.update(cpu_per_request(metrics))
    metrics["torch_threads"] = checks.get("torch_threads_seen")

    reasons = invalid_reasons(records, monitors, arm, checks)
    if monitors is None:
        reasons.append(f"monitor summary {monitors_path} is missing")
    metrics["valid"] = not reasons
    metrics["invalid_reasons"] = reasons
    metrics["checks"] = checks
    return metrics


def failed_run_metrics(arm: dict, run: int, reason: str) -> dict:
    """Metrics for a run that crashed before it measured anything: all null."""
    metrics = _identity(arm, run)
    for name in (*METRICS, *RUN_COUNTS):
        metrics[name] = None
    metrics["valid"] = False
    metrics["invalid_reasons"] = [reason]
    metrics["checks"] = None
    return metrics


def run_number_from_directory(directory: Path) -> int | None:
    """The k of a `run<k>` directory, or None when the name has another form."""
    match = re.fullmatch(r"run(\d+)", Path(directory).name)
    return int(match.group(1)) if match else None


def read_request_log(path: Path) -> list[dict]:
    """The client's per-request records, one JSON object per line."""
    records = []
    with open(path, encoding="utf-8") as log:
        for line_number, line in enumerate(log, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}:{line_number} is not a JSON object ({error}); "
                    "the request log must hold one JSON object per line"
                ) from error
    return records


def read_monitors(path: Path) -> dict | None:
    """The monitors' summary, or None when the monitor left no file."""
    if not Path(path).exists():
        return None
    return json.loads(Path(path).read_text(encoding="utf-8"))


def completed(record: dict) -> bool:
    """A request completed when it ended with a 2xx status and no error."""
    status = record.get("status")
    return (
        record.get("error") is None
        and record.get("end_s") is not None
        and status is not None
        and 200 <= status < 300
    )


def measured(records: Iterable[dict]) -> list[dict]:
    return [record for record in records if record.get("phase") == "measured"]


def request_figures(records: list[dict]) -> dict:
    """Throughput, latency and dispatch-lag figures of the measured requests.

    Throughput counts completed measured requests over the window from the
    first measured send to the last measured completion, so warm-up time is
    outside the window. Latency percentiles cover completed requests only.
    """
    measured_records = measured(records)
    done = [record for record in measured_records if completed(record)]
    sends = [r["sent_s"] for r in measured_records if r.get("sent_s") is not None]
    ends = [record["end_s"] for record in done]
    window = max(ends) - min(sends) if ends and sends else None
    if window is not None and window <= 0:
        window = None

    output_tokens = sum(record.get("output_tokens") or 0 for record in done)
    lags = _values(measured_records, "dispatch_lag_ms")
    ttfts = _values(done, "ttft_ms")
    return {
        "requests_measured": len(measured_records),
        "requests_completed": len(done),
        "requests_warmup": sum(1 for r in records if r.get("phase") == "warmup"),
        "error_count": len(measured_records) - len(done),
        "measured_seconds": window,
        "throughput_rps": len(done) / window if window else None,
        "output_tokens_per_s": output_tokens / window if window else None,
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p90_ms": percentile(ttfts, 90),
        "ttft_p99_ms": percentile(ttfts, 99),
        "e2e_p50_ms": percentile(_values(done, "e2e_ms"), 50),
        "dispatch_lag_p99_ms": percentile(lags, 99),
        "dispatch_lag_max_ms": max(lags) if lags else None,
    }


def monitor_figures(monitors: dict | None) -> dict:
    """CPU, cgroup, thread and GPU figures from the monitors' summary."""
    monitors = monitors or {}
    window = monitors.get("window") or {}
    cgroup = monitors.get("cgroup") or {}
    threads = monitors.get("threads") or {}
    gpu = monitors.get("gpu") or {}
    return {
        "main_cpu_percent": monitors.get("main_cpu_percent"),
        "scheduler_cpu_percent": monitors.get("scheduler_cpu_percent"),
        "cores_used": cgroup.get("cores_used"),
        "throttled_share": cgroup.get("throttled_share"),
        "throttled_seconds": cgroup.get("throttled_seconds"),
        "main_thread_cpu_percent": threads.get("main_thread_cpu_percent"),
        "other_threads_cpu_percent": threads.get("other_threads_cpu_percent"),
        "main_threads_median": threads.get("main_median"),
        "main_threads_max": threads.get("main_max"),
        "gpu_util_percent": gpu.get("util_percent_mean"),
        "gpu_memory_used_mib": gpu.get("memory_used_mib"),
        "window_start_epoch": window.get("start_epoch"),
        "window_end_epoch": window.get("end_epoch"),
    }


def cpu_per_request(metrics: dict) -> dict:
    """What a request costs in CPU: the main process, the scheduler and the quota's
    cgroup, in milliseconds of one core per completed request of the window (the
    monitors' CPU share divided by the throughput over the same window)."""
    throughput = metrics.get("throughput_rps")

    def per_request(cores: float | None) -> float | None:
        if cores is None or not throughput:
            return None
        return 1000 * cores / throughput

    def cores(percent: float | None) -> float | None:
        return None if percent is None else percent / 100

    return {
        "main_cpu_ms_per_request": per_request(cores(metrics.get("main_cpu_percent"))),
        "scheduler_cpu_ms_per_request": per_request(
            cores(metrics.get("scheduler_cpu_percent"))
        ),
        "cgroup_cpu_ms_per_request": per_request(metrics.get("cores_used")),
    }


def invalid_reasons(
    records: list[dict], monitors: dict | None, arm: dict, checks: dict
) -> list[str]:
    """Every reason this run must stay out of the medians, with the numbers."""
    return [
        *_request_reasons(records, arm, checks),
        *_restart_reasons(monitors, checks),
        *_quota_reasons(monitors, arm, checks),
        *_environment_reasons(arm, checks),
        *_identity_reasons(checks),
        *_host_load_reasons(monitors, checks),
    ]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _identity(arm: dict, run: int | None) -> dict:
    return {
        "arm": arm["name"],
        "run": run,
        "variant": arm.get("variant"),
        "workload": arm.get("workload"),
        "transport": arm.get("transport"),
        "concurrency": arm.get("concurrency"),
        "cpu_quota": arm.get("cpu_quota"),
        "environment": dict(arm.get("environment") or {}),
    }


def _values(records: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in records if r.get(key) is not None]


def _request_reasons(records: list[dict], arm: dict, checks: dict) -> list[str]:
    reasons = []
    measured_records = measured(records)
    failures = [record for record in measured_records if not completed(record)]
    if failures:
        first = failures[0]
        what = first.get("error") or f"status {first.get('status')}"
        reasons.append(
            f"{len(failures)} of {len(measured_records)} measured requests did not "
            f"complete (first: request {first.get('index')}: {what})"
        )
    expected_measured = arm.get("requests")
    if expected_measured is not None and len(measured_records) != expected_measured:
        reasons.append(
            f"the log holds {len(measured_records)} measured requests, "
            f"the arm asks for {expected_measured}"
        )
    expected_warmup = checks.get("warmup_requests")
    warmup_count = sum(1 for r in records if r.get("phase") == "warmup")
    if expected_warmup is not None and warmup_count != expected_warmup:
        reasons.append(
            f"warm-up requests in the log: {warmup_count}, expected "
            f"{expected_warmup}; warm-up was not excluded as planned"
        )
    lag_allowed = checks.get("max_dispatch_lag_ms_allowed")
    lags = _values(measured_records, "dispatch_lag_ms")
    if lag_allowed is not None and lags and max(lags) > lag_allowed:
        reasons.append(
            f"dispatch lag reached {max(lags):.1f} ms, above the allowed "
            f"{lag_allowed:g} ms: the client fell behind its schedule"
        )
    return reasons


def _restart_reasons(monitors: dict | None, checks: dict) -> list[str]:
    reasons = []
    if checks.get("server_restarted"):
        reasons.append("the server restarted during the run")
    if monitors and monitors.get("server_pids_changed"):
        reasons.append("the server's process ids changed during the measured window")
    return reasons


def _quota_reasons(monitors: dict | None, arm: dict, checks: dict) -> list[str]:
    reasons = []
    asked = _quota_cores(arm.get("cpu_quota"))
    in_force = checks.get("quota_in_force_cores")
    if not _same_quota(asked, in_force):
        reasons.append(
            f"CPU quota in force was {_describe_quota(in_force)}, "
            f"the arm asks for {_describe_quota(asked)}"
        )
    runner_expected = checks.get("quota_expected_cores")
    if "quota_expected_cores" in checks and not _same_quota(asked, runner_expected):
        reasons.append(
            f"the runner expected a quota of {_describe_quota(runner_expected)}, "
            f"the arm asks for {_describe_quota(asked)}"
        )
    cgroup = (monitors or {}).get("cgroup") or {}
    throttled = cgroup.get("nr_throttled")
    if asked is None and throttled:
        reasons.append(
            f"the cgroup was throttled in {throttled} periods although the arm "
            "has no CPU quota: another limit applied"
        )
    return reasons


def _environment_reasons(arm: dict, checks: dict) -> list[str]:
    reasons = []
    expected = dict(checks.get("environment_expected") or {})
    expected.update(arm.get("environment") or {})
    seen = checks.get("environment_seen") or {}
    for name, value in sorted(expected.items()):
        want = None if value is None else str(value)
        got = seen.get(name)
        got = None if got is None else str(got)
        if want != got:
            reasons.append(
                f"{name} was {_describe_variable(got)} in the server, "
                f"the arm asks for {_describe_variable(want)}"
            )
    omp = expected.get("OMP_NUM_THREADS")
    torch_threads = checks.get("torch_threads_seen")
    if omp is not None and torch_threads is not None and str(omp).isdigit():
        if int(omp) != torch_threads:
            reasons.append(
                f"torch used {torch_threads} intra-op threads, "
                f"OMP_NUM_THREADS={omp} asks for {omp}"
            )
    forced = arm.get("intra_op_threads")
    if forced is not None and torch_threads is not None and forced != torch_threads:
        reasons.append(
            f"torch used {torch_threads} intra-op threads, the arm forces {forced}"
        )
    return reasons


def _identity_reasons(checks: dict) -> list[str]:
    """The server is not the one under study: another transport or mm_utils.py,
    an image that skipped shared memory, or a stand-in placeholder that ran."""
    reasons = []
    expected, seen = checks.get("transport_expected"), checks.get("transport_seen")
    if expected and seen and expected != seen:
        reasons.append(
            f"the server resolved transport {seen!r}, the arm asks {expected!r}"
        )
    expected = checks.get("mm_utils_sha256_expected")
    loaded = checks.get("mm_utils_sha256_loaded")
    if expected and loaded and expected != loaded:
        reasons.append(
            f"the server's main process loaded an mm_utils.py with sha256 "
            f"{loaded[:12]}..., the variant's is {expected[:12]}..."
        )
    if checks.get("inline_fallback_reported"):
        reasons.append(
            "SGLang sent images inline because /dev/shm was full, so the "
            "shared-memory copy under study was skipped; give the server more /dev/shm"
        )
    for module in checks.get("patched_modules_never_loaded") or []:
        reasons.append(
            f"the variant's change is to {module.replace('.', '/')}.py, which no "
            "server process loaded: the patch does not touch the code under study"
        )
    placeholders = checks.get("stand_in_placeholders_called") or []
    if placeholders:
        reasons.append(
            "the sgl-kernel stand-in's placeholders ran: " + ", ".join(placeholders)
        )
    return reasons


def _host_load_reasons(monitors: dict | None, checks: dict) -> list[str]:
    """Other work on the host took CPU during the window (host_load.py)."""
    allowed = checks.get("max_other_load_cores_allowed")
    load = (monitors or {}).get("host_load")
    if allowed is None or not load or load["other_cores"] <= allowed:
        return []
    return [
        f"other work on the host used {load['other_cores']:.2f} cores on average "
        f"during the measured window (the host was {load['host_busy_cores']:.2f} "
        f"cores busy, the run itself {load['own_cores']:.2f}), above the allowed "
        f"{allowed:g} (host_sharing.max_other_load_cores): the run did not have "
        "the host to itself"
    ]


def _quota_cores(quota) -> float | None:
    if quota is None or quota == "none":
        return None
    return float(quota)


def _same_quota(first: float | None, second: float | None) -> bool:
    if first is None or second is None:
        return first is None and second is None
    return math.isclose(first, second, abs_tol=QUOTA_TOLERANCE_CORES)


def _describe_quota(cores: float | None) -> str:
    return "none" if cores is None else f"{cores:g} cores"


def _describe_variable(value: str | None) -> str:
    return "unset" if value is None else repr(value)
