"""From every run's metrics to per-arm summaries, ratios and claim verdicts.

Five tables come out, each written as CSV:

- `runs`: every run with every figure, valid or not.
- `arms`: per arm and figure, the median over valid runs, [min, max], the
  count of valid runs, a bootstrap 95% interval of the median when there are
  at least five valid runs, and the study's reference value.
- `ratios`: for each ratio claim, the ratio of the two arms' medians and the
  ratio within each repetition block (run k of one arm against run k of the
  other; every block runs every arm once, so drift hits both alike).
- `invalid_runs`: which runs were left out and why.
- `claims`: one verdict per claim of the config: holds, does not hold, or
  cannot tell when an arm has too few valid runs.
- `releases` (only when the config sets `release_series`): each release
  against the one before it, and the first that changed (release_change.py).
- `fixes` (only when the config sets `fixes`): each fix beside the trap, with
  its throughput under the quota and its CPU cost without one
  (fix_comparison.py).

Invalid runs never enter a median. With three runs a bootstrap interval can
only take the three observed values, so below five runs none is given and
the note states how often [min, max] covers the true median instead.
"""

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from serving_study.analysis.fix_comparison import FIXES_TABLE, fixes_table
from serving_study.analysis.release_change import (
    ChangeCriterion,
    release_labels,
    releases_table,
)
from serving_study.measure.run_metrics import METRICS, RUN_COUNTS

TABLE_NAMES = ("runs", "arms", "ratios", "invalid_runs", "claims")
# Written only for an experiment whose arms are a release series.
RELEASE_TABLE = "releases"
# Written by the thread x quota map's own rule (thread_quota_map.py) when configured.
MAP_TABLE = "thread_quota_map"

HOLDS = "holds"
DOES_NOT_HOLD = "does not hold"
CANNOT_TELL = "cannot tell"

MIN_RUNS_FOR_INTERVAL = 5
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20_260_101
DEFAULT_MIN_VALID_RUNS = 3

IDENTITY_COLUMNS = (
    "arm",
    "run",
    "variant",
    "workload",
    "transport",
    "concurrency",
    "cpu_quota",
    "environment",
)


def aggregate(metrics_paths: Iterable[Path], config: dict) -> dict[str, pd.DataFrame]:
    """Read every run's metrics.json and build the five tables."""
    return tables_from_metrics(load_metrics(metrics_paths), config)


def load_metrics(metrics_paths: Iterable[Path]) -> list[dict]:
    return [
        json.loads(Path(path).read_text(encoding="utf-8")) for path in metrics_paths
    ]


def tables_from_metrics(records: list[dict], config: dict) -> dict[str, pd.DataFrame]:
    """Build the five tables from metrics records (see the module docstring)."""
    check_claims(config)
    runs = runs_table(records, config)
    arms = arms_table(runs, config)
    tables = {
        "runs": runs,
        "arms": arms,
        "ratios": ratios_table(runs, arms, config),
        "invalid_runs": invalid_runs_table(runs),
        "claims": claims_table(runs, arms, config),
    }
    if config.get("fixes"):
        tables[FIXES_TABLE] = fixes_table(arms, tables["claims"], config["fixes"])
    if config.get("release_series"):
        tables[RELEASE_TABLE] = releases_table(
            arms,
            runs,
            release_labels(config),
            ChangeCriterion.from_config(config.get("change_criterion")),
        )
    return tables


def write_tables(tables: dict[str, pd.DataFrame], out_dir: Path) -> list[Path]:
    """Write each table as `<name>.csv` under out_dir; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in (*TABLE_NAMES, RELEASE_TABLE, FIXES_TABLE):
        if name not in tables:
            continue
        path = out_dir / f"{name}.csv"
        tables[name].to_csv(path, index=False)
        paths.append(path)
    return paths


def read_tables(in_dir: Path) -> dict[str, pd.DataFrame]:
    """Read back the tables written by `write_tables`."""
    tables = {}
    for name in TABLE_NAMES:
        path = Path(in_dir) / f"{name}.csv"
        try:
            tables[name] = pd.read_csv(path)
        except pd.errors.EmptyDataError:
            tables[name] = pd.DataFrame()
    releases = Path(in_dir) / f"{RELEASE_TABLE}.csv"
    if releases.is_file():
        # Release names stay text: "1.10" is not the number 1.1.
        names = {"release": str, "compared_with": str, "arm": str}
        tables[RELEASE_TABLE] = pd.read_csv(releases, dtype=names)
    fixes = Path(in_dir) / f"{FIXES_TABLE}.csv"
    if fixes.is_file():
        tables[FIXES_TABLE] = pd.read_csv(fixes, keep_default_na=False, na_values=[""])
    cells = Path(in_dir) / f"{MAP_TABLE}.csv"
    if cells.is_file():
        # Quotas stay text: "none" sits beside numbers of cores.
        tables[MAP_TABLE] = pd.read_csv(
            cells, dtype={"variant": str, "cpu_quota": str, "invalid_reason": str}
        )
    return tables


# --- runs ---------------------------------------------------------------------


def runs_table(records: list[dict], config: dict) -> pd.DataFrame:
    rows = []
    for record in records:
        row = {column: record.get(column) for column in IDENTITY_COLUMNS}
        row["cpu_quota"] = _text(record.get("cpu_quota"))
        row["environment"] = describe_environment(record.get("environment"))
        row["valid"] = bool(record.get("valid"))
        row["invalid_reasons"] = "; ".join(record.get("invalid_reasons") or [])
        for name in (*RUN_COUNTS, *METRICS):
            row[name] = record.get(name)
        rows.append(row)
    columns = [*IDENTITY_COLUMNS, "valid", "invalid_reasons", *RUN_COUNTS, *METRICS]
    runs = pd.DataFrame(rows, columns=columns)
    for name in (*RUN_COUNTS, *METRICS):
        runs[name] = pd.to_numeric(runs[name], errors="coerce").astype(float)
    order = {arm["name"]: position for position, arm in enumerate(config["arms"])}
    runs["_order"] = runs["arm"].map(lambda arm: order.get(arm, len(order)))
    runs = runs.sort_values(["_order", "arm", "run"], kind="stable")
    return runs.drop(columns="_order").reset_index(drop=True)


def describe_environment(environment: dict | None) -> str:
    if not environment:
        return "default"
    return " ".join(f"{name}={value}" for name, value in sorted(environment.items()))


# --- arms ---------------------------------------------------------------------


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
        return {
            "n_values": 0,
            "median": math.nan,
            "min": math.nan,
            "max": math.nan,
            "ci_low": math.nan,
            "ci_high": math.nan,
            "ci_note": "no valid run has this figure",
        }
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


# --- ratios and claims --------------------------------------------------------


def check_claims(config: dict) -> None:
    """Raise ValueError naming the claim when a claim or reference is malformed."""
    arm_names = {arm["name"] for arm in config["arms"]}
    for entry in (config.get("reference") or {}).get("arms") or []:
        if entry.get("arm") not in arm_names:
            raise ValueError(
                f"reference.arms names arm {entry.get('arm')!r}, which is not in "
                f"the experiment's arms {sorted(arm_names)}; fix the name or drop it"
            )
        for metric in entry:
            if metric != "arm" and metric not in METRICS:
                raise ValueError(
                    f"reference for arm {entry['arm']!r} gives {metric!r}, which is "
                    f"not a run figure; use one of {sorted(METRICS)}"
                )
    for claim in config.get("claims") or []:
        name = claim.get("name", "<unnamed>")
        kind = claim_kind(claim)
        if claim.get("metric") not in METRICS:
            raise ValueError(
                f"claim {name!r} uses metric {claim.get('metric')!r}; "
                f"use one of {sorted(METRICS)}"
            )
        named_arms = claim_arms(claim)
        unknown = [arm for arm in named_arms if arm not in arm_names]
        if unknown:
            raise ValueError(
                f"claim {name!r} names arms {unknown} that are not in the "
                f"experiment's arms {sorted(arm_names)}"
            )
        if kind == "ratio" and (
            len(named_arms) != 2
            or (claim.get("at_least") is None and claim.get("at_most") is None)
        ):
            raise ValueError(
                f"ratio claim {name!r} needs numerator, denominator and at least "
                "one of at_least / at_most"
            )
        if kind == "within" and (len(named_arms) < 2 or "tolerance" not in claim):
            raise ValueError(
                f"within claim {name!r} needs at least two arms and a tolerance"
            )
        if kind not in ("ratio", "within"):
            raise ValueError(f"claim {name!r} has kind {kind!r}; use ratio or within")


def claim_kind(claim: dict) -> str:
    return claim.get("kind", "ratio")


def claim_arms(claim: dict) -> list[str]:
    if claim_kind(claim) == "within":
        return list(claim.get("arms") or [])
    return [claim.get("numerator"), claim.get("denominator")]


def ratios_table(runs: pd.DataFrame, arms: pd.DataFrame, config: dict) -> pd.DataFrame:
    rows = []
    for claim in config.get("claims") or []:
        if claim_kind(claim) != "ratio":
            continue
        rows.append(ratio_row(claim, runs, arms, config))
    columns = [
        "claim",
        "metric",
        "numerator",
        "denominator",
        "numerator_median",
        "denominator_median",
        "ratio_of_medians",
        "reference_ratio",
        "paired_blocks",
        "block_ratio_min",
        "block_ratio_max",
        "block_ratios",
    ]
    return pd.DataFrame(rows, columns=columns)


def ratio_row(claim: dict, runs, arms, config) -> dict:
    metric = claim["metric"]
    numerator_median = arm_median(arms, claim["numerator"], metric)
    denominator_median = arm_median(arms, claim["denominator"], metric)
    blocks = block_ratios(runs, claim["numerator"], claim["denominator"], metric)
    # A missing median is NaN and keeps the ratio NaN; only zero needs a guard.
    ratio = numerator_median / denominator_median if denominator_median else math.nan
    block_values = list(blocks.values())
    return {
        "claim": claim["name"],
        "metric": metric,
        "numerator": claim["numerator"],
        "denominator": claim["denominator"],
        "numerator_median": numerator_median,
        "denominator_median": denominator_median,
        "ratio_of_medians": ratio,
        "reference_ratio": reference_ratio(claim, config),
        "paired_blocks": len(blocks),
        "block_ratio_min": min(block_values) if block_values else math.nan,
        "block_ratio_max": max(block_values) if block_values else math.nan,
        "block_ratios": "; ".join(
            f"run{run} {value:.3g}" for run, value in blocks.items()
        ),
    }


def block_ratios(
    runs: pd.DataFrame, numerator: str, denominator: str, metric: str
) -> dict[int, float]:
    """Ratio within each repetition block where both arms' runs are valid."""
    valid = runs[runs["valid"] & runs[metric].notna()]
    top = valid[valid["arm"] == numerator].set_index("run")[metric]
    bottom = valid[valid["arm"] == denominator].set_index("run")[metric]
    blocks = {}
    for run in sorted(set(top.index) & set(bottom.index)):
        if bottom[run] != 0:
            blocks[int(run)] = float(top[run] / bottom[run])
    return blocks


def reference_ratio(claim: dict, config: dict) -> float:
    """The claim's stated study ratio, else the ratio of the reference values."""
    if claim.get("reference_ratio") is not None:
        return float(claim["reference_ratio"])
    references = reference_values(config)
    top = references.get((claim["numerator"], claim["metric"]))
    bottom = references.get((claim["denominator"], claim["metric"]))
    if top is None or not bottom:
        return math.nan
    return top / bottom


def arm_median(arms: pd.DataFrame, arm: str, metric: str) -> float:
    row = arms[(arms["arm"] == arm) & (arms["metric"] == metric)]
    return float(row["median"].iloc[0]) if len(row) else math.nan


def claims_table(runs: pd.DataFrame, arms: pd.DataFrame, config: dict) -> pd.DataFrame:
    rows = []
    for claim in config.get("claims") or []:
        if claim_kind(claim) == "ratio":
            row = judge_ratio(claim, runs, arms, config)
        else:
            row = judge_within(claim, runs, arms, config)
        row["sentence"] = (
            f"{claim['statement']}: {row['verdict']} here ({row['detail']})"
        )
        rows.append(row)
    columns = [
        "claim",
        "kind",
        "statement",
        "metric",
        "arms",
        "verdict",
        "value",
        "bound",
        "reference_value",
        "detail",
        "sentence",
    ]
    return pd.DataFrame(rows, columns=columns)


def judge_ratio(claim: dict, runs, arms, config) -> dict:
    ratio = ratio_row(claim, runs, arms, config)
    bound = describe_ratio_bound(claim)
    study = ratio["reference_ratio"]
    study_text = f"; study {study:.3g}x" if is_number(study) else ""
    row = _claim_row(claim, bound)
    row["value"] = ratio["ratio_of_medians"]
    row["reference_value"] = study
    shortfall = too_few_runs(claim, arms)
    if shortfall:
        row["verdict"] = CANNOT_TELL
        row["detail"] = shortfall + study_text
        return row
    value = ratio["ratio_of_medians"]
    if not is_number(value):
        row["verdict"] = CANNOT_TELL
        row["detail"] = (
            f"no ratio: the {claim['denominator']} median of {claim['metric']} "
            f"is {ratio['denominator_median']}{study_text}"
        )
        return row
    holds = ratio_within_bounds(value, claim)
    blocks = block_ratios(
        runs, claim["numerator"], claim["denominator"], claim["metric"]
    )
    agreeing = sum(ratio_within_bounds(block, claim) for block in blocks.values())
    block_text = f"; {agreeing} of {len(blocks)} paired runs meet it" if blocks else ""
    row["verdict"] = HOLDS if holds else DOES_NOT_HOLD
    shortfall_text = "" if holds else f", the claim needs {bound}"
    row["detail"] = f"{value:.3g}x{shortfall_text}{block_text}{study_text}"
    return row


def judge_within(claim: dict, runs, arms, config) -> dict:
    metric = claim["metric"]
    tolerance = float(claim["tolerance"])
    row = _claim_row(claim, f"spread at most {tolerance:.0%}")
    medians = [arm_median(arms, arm, metric) for arm in claim["arms"]]
    study = claim.get("reference_spread")
    if study is None:
        references = reference_values(config)
        study_values = [references.get((arm, metric)) for arm in claim["arms"]]
        study = spread(study_values) if None not in study_values else math.nan
    study_text = f"; study {study:.1%}" if is_number(study) else ""
    row["reference_value"] = study
    row["value"] = math.nan
    shortfall = too_few_runs(claim, arms)
    if shortfall or not all(is_number(median) for median in medians):
        row["verdict"] = CANNOT_TELL
        row["detail"] = (shortfall or f"an arm has no {metric} value") + study_text
        return row
    value = spread(medians)
    row["value"] = value
    if not is_number(value):
        row["verdict"] = CANNOT_TELL
        row["detail"] = f"an arm's median {metric} is not positive{study_text}"
        return row
    holds = value <= tolerance
    row["verdict"] = HOLDS if holds else DOES_NOT_HOLD
    unit = METRICS[metric].unit
    row["detail"] = (
        f"{', '.join(claim['arms'])}: medians {format_number(min(medians))} to "
        f"{format_number(max(medians))} {unit}, spread {value:.1%}, "
        f"allowed {tolerance:.0%}{study_text}"
    )
    return row


def spread(values: list[float]) -> float:
    """How far the largest value is above the smallest, as a fraction."""
    smallest = min(values)
    if smallest <= 0:
        return math.nan
    return max(values) / smallest - 1


def ratio_within_bounds(value: float, claim: dict) -> bool:
    at_least = claim.get("at_least")
    at_most = claim.get("at_most")
    return (at_least is None or value >= at_least) and (
        at_most is None or value <= at_most
    )


def describe_ratio_bound(claim: dict) -> str:
    parts = []
    if claim.get("at_least") is not None:
        parts.append(f"at least {claim['at_least']:g}x")
    if claim.get("at_most") is not None:
        parts.append(f"at most {claim['at_most']:g}x")
    return " and ".join(parts)


def too_few_runs(claim: dict, arms: pd.DataFrame) -> str:
    """Why the claim cannot be judged for lack of valid runs, or ''."""
    needed = int(claim.get("min_valid_runs", DEFAULT_MIN_VALID_RUNS))
    short = []
    for arm in claim_arms(claim):
        rows = arms[arms["arm"] == arm]
        valid = int(rows["n_valid"].iloc[0]) if len(rows) else 0
        total = int(rows["n_total"].iloc[0]) if len(rows) else 0
        if valid < needed:
            short.append(
                f"{arm} has {valid} valid run{'s' if valid != 1 else ''} of {total}"
            )
    if not short:
        return ""
    return f"{'; '.join(short)}; the claim needs {needed}"


def invalid_runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    invalid = runs[~runs["valid"]]
    return (
        invalid[["arm", "run", "invalid_reasons"]]
        .rename(columns={"invalid_reasons": "reasons"})
        .reset_index(drop=True)
    )


def _claim_row(claim: dict, bound: str) -> dict:
    return {
        "claim": claim["name"],
        "kind": claim_kind(claim),
        "statement": claim["statement"],
        "metric": claim["metric"],
        "arms": ", ".join(claim_arms(claim)),
        "bound": bound,
    }


# --- formatting shared with the report ----------------------------------------


def format_number(value) -> str:
    """A figure as people read it: thousands separators, about 3 digits."""
    if not is_number(value):
        return "–"
    value = float(value)
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def is_number(value) -> bool:
    if value is None or isinstance(value, str | bool):
        return False
    try:
        return not math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def _text(value) -> str | None:
    return None if value is None else str(value)
