"""The figures of one measured run, and whether the run counts.

The arm runner leaves three things per run: the client's per-request log
(`requests.jsonl`, request_log.py), the host-side monitors' summary
(`monitors.json`) and the checks it made while the server ran. `summarize_run`
turns them into the run's `metrics.json`: throughput, latency percentiles, CPU and
GPU use, and a validity verdict with a human-readable reason for every check that
failed (run_validity.py).
A run that never produced a log gets `failed_run_metrics` instead, so every
run of the plan has a metrics file and the report can list it.

Percentiles use linear interpolation between order statistics (numpy's
default), so the p50 of an even count is the mean of the two middle values.
"""

import json
import re
from pathlib import Path

import numpy as np

from serving_study.config.records import Arm, quota_value
from serving_study.measure.request_log import (
    completed,
    measured,
    read_request_log,
    values_of,
)
from serving_study.measure.run_validity import invalid_reasons, only_outside_the_arm
from serving_study.metric_catalogue import METRICS, RUN_COUNTS


def summarize_run(
    requests_path: Path,
    monitors_path: Path,
    arm: Arm,
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
    monitors = None
    if monitors_path.exists():
        monitors = json.loads(monitors_path.read_text(encoding="utf-8"))

    metrics = _identity(arm, run) | request_figures(records) | monitor_figures(monitors)
    metrics |= cpu_per_request(metrics)
    metrics["torch_threads"] = checks.get("torch_threads_seen")

    reasons = invalid_reasons(records, monitors, arm, checks)
    if monitors is None:
        reasons.append(f"monitor summary {monitors_path} is missing")
    metrics["valid"] = not reasons
    metrics["invalid_reasons"] = reasons
    metrics["outside_the_arm"] = only_outside_the_arm(reasons, monitors, checks)
    metrics["checks"] = checks
    return metrics


def failed_run_metrics(
    arm: Arm, run: int, reason: str, outside_the_arm: bool = False
) -> dict:
    """Metrics for a run that crashed before it measured anything: all null."""
    metrics = _identity(arm, run) | dict.fromkeys((*METRICS, *RUN_COUNTS))
    metrics["valid"] = False
    metrics["invalid_reasons"] = [reason]
    metrics["outside_the_arm"] = outside_the_arm
    metrics["checks"] = None
    return metrics


def run_number_from_directory(directory: Path) -> int | None:
    """The k of a `run<k>` directory, or None when the name has another form."""
    match = re.fullmatch(r"run(\d+)", Path(directory).name)
    return int(match.group(1)) if match else None


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
    lags = values_of(measured_records, "dispatch_lag_ms")
    ttfts = values_of(done, "ttft_ms")
    # As bench_serving defines them: a request's time per output token after the
    # first, and every gap between token chunks of every request.
    tpots = [
        (record["e2e_ms"] - record["ttft_ms"]) / (record["output_tokens"] - 1)
        for record in done
        if (record.get("output_tokens") or 0) > 1 and record.get("ttft_ms") is not None
    ]
    itls = [gap for record in done for gap in record.get("itl_ms") or ()]
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
        "e2e_p50_ms": percentile(values_of(done, "e2e_ms"), 50),
        **{f"tpot_p{q}_ms": percentile(tpots, q) for q in (50, 90, 99)},
        **{f"itl_p{q}_ms": percentile(itls, q) for q in (50, 90, 99)},
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
    host_load = monitors.get("host_load") or {}
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
        "host_other_cores": host_load.get("other_cores"),
        "host_steal_cores": host_load.get("steal_cores"),
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


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _identity(arm: Arm, run: int | None) -> dict:
    return {
        "arm": arm.name,
        "run": run,
        "variant": arm.variant,
        "workload": arm.workload,
        "transport": arm.transport,
        "concurrency": arm.concurrency,
        "cpu_quota": quota_value(arm.cpu_quota),
        "environment": dict(arm.environment),
    }
