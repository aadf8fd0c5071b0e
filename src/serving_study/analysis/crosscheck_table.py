"""The cross-check's tables: every run of both clients, and the verdict.

``client_crosscheck_runs`` has one row per run (pair, client, whether it counts,
its throughput, latencies, the server's CPU and the host's other load over its
window). ``client_crosscheck`` puts the two clients side by side over the pairs
where both runs count: each client's median throughput and TTFT, the median of
the pairs' throughput ratios (ours over bench_serving's) with their range, and
beside it the verdict: within the tolerance (5% unless the config says
otherwise) of 1, or not.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd

from serving_study.config.crosscheck_settings import ClientCrosscheck

SUMMARY_TABLE = "client_crosscheck"
RUNS_TABLE = "client_crosscheck_runs"
# The two clients, as the tables and a pair's folders name them.
OURS = "ours"
THEIRS = "bench_serving"
CLIENTS = (OURS, THEIRS)
RUN_FIGURES = (
    "requests_completed",
    "measured_seconds",
    "throughput_rps",
    "output_tokens_per_s",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "e2e_p50_ms",
    "tpot_p50_ms",
    "itl_p50_ms",
    "main_cpu_percent",
    "main_cpu_ms_per_request",
    "cores_used",
    "throttled_share",
    "host_other_cores",
    "host_steal_cores",
    "client_cpu_ms_per_request",
)
# Figures each client's median is shown for, side by side.
SIDE_BY_SIDE = (
    "throughput_rps",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "e2e_p50_ms",
    "main_cpu_ms_per_request",
    "client_cpu_ms_per_request",
)


def read_pair(directory: Path) -> dict:
    """A pair's record and each client's metrics, ours with its CPU per request."""
    directory = Path(directory)
    pair = {
        "record": json.loads((directory / "pair.json").read_text()),
        **{
            client: json.loads((directory / client / "metrics.json").read_text())
            for client in CLIENTS
        },
    }
    pair[OURS]["client_cpu_ms_per_request"] = our_cpu_per_request(directory / OURS)
    return pair


def our_cpu_per_request(run: Path) -> float | None:
    """Our client's CPU per request of its run, warm-up included (it counts the
    whole load, less what the monitors' sampler took in the same process)."""
    client = json.loads((run / "provenance.json").read_text()).get("client")
    monitors = json.loads((run / "monitors.json").read_text())
    if not client or not monitors:
        return None
    requests = client["warmup_requests"] + client["measured_requests"]
    cpu = client["client_cpu_seconds"] - monitors["sampler_cpu_seconds"]
    return 1000 * cpu / requests


def runs_table(pairs: list[dict]) -> pd.DataFrame:
    rows = []
    for pair in pairs:
        record = pair["record"]
        for client in CLIENTS:
            metrics = pair[client]
            rows.append(
                {
                    "pair": record["pair"],
                    "client": client,
                    "order": record["order"].index(client) + 1,
                    "valid": bool(metrics.get("valid")),
                    "attempts": len(record["attempts"]),
                    "invalid_reasons": "; ".join(metrics.get("invalid_reasons") or []),
                    **{name: metrics.get(name) for name in RUN_FIGURES},
                }
            )
    return pd.DataFrame(rows, columns=list(rows[0]) if rows else None)


def summary_table(runs: pd.DataFrame, crosscheck: ClientCrosscheck) -> pd.DataFrame:
    """The two clients over the pairs where both runs count, and the verdict."""
    both = runs.groupby("pair")["valid"].transform("all")
    counted = runs[both]
    by_client = {
        client: counted[counted["client"] == client].set_index("pair")
        for client in CLIENTS
    }
    ratios = (
        by_client[OURS]["throughput_rps"] / by_client[THEIRS]["throughput_rps"]
    ).tolist()
    ttft_gaps = (
        by_client[OURS]["ttft_p50_ms"] - by_client[THEIRS]["ttft_p50_ms"]
    ).tolist()
    ratio = statistics.median(ratios) if ratios else None
    row = {
        "arm": crosscheck.arm,
        "pairs": int(runs["pair"].nunique()),
        "valid_pairs": len(ratios),
    }
    for name in SIDE_BY_SIDE:
        for client in CLIENTS:
            values = by_client[client][name].dropna().tolist()
            row[f"{client}_{name}"] = statistics.median(values) if values else None
    row |= {
        "ratio": ratio,
        "ratio_min": min(ratios, default=None),
        "ratio_max": max(ratios, default=None),
        "tolerance": crosscheck.tolerance,
        "verdict": verdict(ratio, crosscheck.tolerance),
        "ttft_p50_difference_ms": statistics.median(ttft_gaps) if ttft_gaps else None,
    }
    return pd.DataFrame([row])


def verdict(ratio: float | None, tolerance: float) -> str:
    """Whether our throughput is within ``tolerance`` of bench_serving's."""
    if ratio is None:
        return "no pair where both runs count"
    within = round(abs(ratio - 1), 12) <= tolerance  # 1.05 - 1 is 0.05000...04
    return f"{'within' if within else 'not within'} {tolerance:.0%}"


def write_tables(
    pair_directories: list[Path], crosscheck: ClientCrosscheck, out_dir: Path
) -> dict[str, Path]:
    runs = runs_table([read_pair(directory) for directory in pair_directories])
    paths = {
        RUNS_TABLE: Path(out_dir) / f"{RUNS_TABLE}.csv",
        SUMMARY_TABLE: Path(out_dir) / f"{SUMMARY_TABLE}.csv",
    }
    paths[RUNS_TABLE].parent.mkdir(parents=True, exist_ok=True)
    runs.to_csv(paths[RUNS_TABLE], index=False)
    summary_table(runs, crosscheck).to_csv(paths[SUMMARY_TABLE], index=False)
    return paths
