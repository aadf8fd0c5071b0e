"""Every run in one table, and each arm's figures summarized over its valid runs.

Invalid runs never enter a median. With three runs a bootstrap interval can
only take the three observed values, so below five runs none is given and
the note states how often [min, max] covers the true median instead.
"""

import math

import numpy as np
import pandas as pd

from serving_study.config.open_loop import describe_load, open_loop_values
from serving_study.metric_catalogue import METRICS, RUN_COUNTS

MIN_RUNS_FOR_INTERVAL = 5
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20_260_101

IDENTITY_COLUMNS = (
    "arm",
    "run",
    "variant",
    "workload",
    "transport",
    "concurrency",
    "load",
    "cpu_quota",
    "environment",
)
# The fields where the node a run ran on differs from host.json (its provenance's
# node_differs_from_host, measure/run_node.py), joined with ","; empty when none.
NODE_FLAG = "node_differs_from_host"


def runs_table(records: list[dict], config: dict) -> pd.DataFrame:
    rows = []
    loads = {arm["name"]: arm_load(arm) for arm in config["arms"]}
    for record in records:
        row = {column: record.get(column) for column in IDENTITY_COLUMNS}
        row["load"] = loads.get(record.get("arm"))
        row["cpu_quota"] = _text(record.get("cpu_quota"))
        row["environment"] = describe_environment(record.get("environment"))
        row["valid"] = bool(record.get("valid"))
        row["invalid_reasons"] = "; ".join(record.get("invalid_reasons") or [])
        row["attempts"] = record.get("attempts", 1)
        row["retried_because"] = record.get("retried_because", "")
        row[NODE_FLAG] = ",".join(record.get(NODE_FLAG) or [])
        rows.append(row | {name: record.get(name) for name in (*RUN_COUNTS, *METRICS)})
    columns = [*IDENTITY_COLUMNS, "valid", "invalid_reasons", "attempts"]
    columns += ["retried_because", NODE_FLAG]
    columns += [*RUN_COUNTS, *METRICS]
    runs = pd.DataFrame(rows, columns=columns)
    for name in (*RUN_COUNTS, *METRICS):
        runs[name] = pd.to_numeric(runs[name], errors="coerce").astype(float)
    return in_config_order(runs, config)


def in_config_order(table: pd.DataFrame, config: dict) -> pd.DataFrame:
    """``table``'s rows by arm in the config's order, then by run (stable)."""
    order = {arm["name"]: position for position, arm in enumerate(config["arms"])}
    table = table.assign(_order=table["arm"].map(lambda a: order.get(a, len(order))))
    table = table.sort_values(["_order", "arm", "run"], kind="stable")
    return table.drop(columns="_order").reset_index(drop=True)


def arm_load(arm: dict) -> str:
    """How a config arm's requests come: a closed loop, or a rate and its
    burstiness with the most in flight (config/open_loop.py)."""
    return describe_load(arm.get("concurrency"), **open_loop_values(arm))


def describe_environment(environment: dict | None) -> str:
    if not environment:
        return "default"
    return " ".join(f"{name}={value}" for name, value in sorted(environment.items()))


def invalid_runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    invalid = runs[~runs["valid"]]
    return (
        invalid[["arm", "run", "invalid_reasons"]]
        .rename(columns={"invalid_reasons": "reasons"})
        .reset_index(drop=True)
    )


def arms_table(runs: pd.DataFrame, config: dict) -> pd.DataFrame:
    """One row per arm and figure: median over valid runs and its spread."""
    references = reference_values(config)
    rows = []
    for arm in config["arms"]:
        arm_runs = runs[runs["arm"] == arm["name"]]
        valid_runs = arm_runs[arm_runs["valid"]]
        for metric, info in METRICS.items():
            values = valid_runs[metric].dropna().to_numpy(dtype=float)
            summary = summarize_values(values)
            rows.append(
                {
                    "arm": arm["name"],
                    "variant": arm.get("variant"),
                    "transport": arm.get("transport"),
                    "concurrency": arm.get("concurrency"),
                    "load": arm_load(arm),
                    "cpu_quota": _text(arm.get("cpu_quota")),
                    "environment": describe_environment(arm.get("environment")),
                    "metric": metric,
                    "label": info.label,
                    "unit": info.unit,
                    "n_valid": len(valid_runs),
                    "n_total": len(arm_runs),
                    **summary,
                    "reference": references.get((arm["name"], metric)),
                }
            )
    table = pd.DataFrame(rows)
    table["reference"] = pd.to_numeric(table["reference"]).astype(float)
    return table


def summarize_values(values: np.ndarray) -> dict:
    """Median, min, max and (for n >= 5) a bootstrap 95% interval of the median."""
    count = len(values)
    if count == 0:
        missing = dict.fromkeys(("median", "min", "max", "ci_low", "ci_high"), math.nan)
        return {"n_values": 0, **missing, "ci_note": "no valid run has this figure"}
    summary = {
        "n_values": count,
        "median": float(np.median(values)),
        "min": float(values.min()),
        "max": float(values.max()),
    }
    if count >= MIN_RUNS_FOR_INTERVAL:
        low, high = bootstrap_median_interval(values)
        note = (
            f"bootstrap percentile interval of the median, "
            f"{BOOTSTRAP_RESAMPLES:,} resamples of {count} runs"
        )
    else:
        low = high = math.nan
        coverage = 1 - 2 * 0.5**count
        note = (
            f"{count} valid run{'s' if count != 1 else ''}: no bootstrap interval "
            f"(needs {MIN_RUNS_FOR_INTERVAL}); [min, max] covers the true median "
            f"with probability {coverage:.0%}"
        )
    return {**summary, "ci_low": low, "ci_high": high, "ci_note": note}


def bootstrap_median_interval(values: np.ndarray) -> tuple[float, float]:
    generator = np.random.default_rng(BOOTSTRAP_SEED)
    samples = generator.choice(values, size=(BOOTSTRAP_RESAMPLES, len(values)))
    medians = np.median(samples, axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


def reference_values(config: dict) -> dict[tuple[str, str], float]:
    """The study's numbers keyed by (arm, metric), from `reference.arms`."""
    values = {}
    for entry in (config.get("reference") or {}).get("arms") or []:
        for metric, value in entry.items():
            if metric != "arm" and value is not None:
                values[(entry["arm"], metric)] = float(value)
    return values


def arm_median(arms: pd.DataFrame, arm: str, metric: str) -> float:
    row = arms[(arms["arm"] == arm) & (arms["metric"] == metric)]
    return float(row["median"].iloc[0]) if len(row) else math.nan


def _text(value) -> str | None:
    return None if value is None else str(value)
