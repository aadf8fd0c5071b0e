"""Each claim of the config judged on the arms' medians: holds, does not hold, or
cannot tell.

A ratio claim compares two arms' medians of one figure against a bound, and
lists the ratio within each repetition block beside it (run k of one arm
against run k of the other; every block runs every arm once, so drift hits
both alike). A "within" claim asks that several arms' medians lie within a
tolerance of each other. A claim whose arms have too few valid runs cannot be
told either way.

Beside each verdict stands where its bound came from (the claim's ``bound_from``),
and so what the verdict is: a test of a bound stated before any run of its effect,
or a confirmation of one set after such a run (a pilot, or a redesign after a
failed verdict).
"""

import math

import pandas as pd

from serving_study.analysis.numbers import format_number, is_number
from serving_study.analysis.summaries import arm_median, reference_values
from serving_study.config.records import BoundSource
from serving_study.config.schema import property_schema
from serving_study.metric_catalogue import METRICS

HOLDS = "holds"
DOES_NOT_HOLD = "does not hold"
CANNOT_TELL = "cannot tell"

DEFAULT_MIN_VALID_RUNS = property_schema("claims", "min_valid_runs")["default"]

# What a bound of each kind of bound_from makes its verdict, and how it is named.
TESTED_KINDS = ("study", "reasoning")
SOURCE_WORDS = {
    "study": "the study",
    "reasoning": "our reasoning",
    "pilot": "a pilot",
    "redesign": "a redesign after a failed verdict",
}


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
        if "bound_from" not in claim:
            raise ValueError(
                f"claim {name!r} lacks bound_from: say where its bound came from "
                f"(kind: one of {', '.join(SOURCE_WORDS)})"
            )
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
    rows = [
        ratio_row(claim, runs, arms, config)
        for claim in config.get("claims") or []
        if claim_kind(claim) == "ratio"
    ]
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
        "block_ratio_min": min(blocks.values(), default=math.nan),
        "block_ratio_max": max(blocks.values(), default=math.nan),
        "block_ratios": describe_block_ratios(blocks),
    }


def block_ratios(
    runs: pd.DataFrame, numerator: str, denominator: str, metric: str
) -> dict[int, float]:
    """Ratio within each repetition block where both arms' runs are valid."""
    valid = runs[runs["valid"] & runs[metric].notna()]
    top = valid[valid["arm"] == numerator].set_index("run")[metric]
    bottom = valid[valid["arm"] == denominator].set_index("run")[metric]
    return {
        int(run): float(top[run] / bottom[run])
        for run in sorted(set(top.index) & set(bottom.index))
        if bottom[run] != 0
    }


def describe_block_ratios(blocks: dict[int, float]) -> str:
    """ "run1 0.86; run2 0.84": the ratio within each block."""
    return "; ".join(f"run{run} {ratio:.3g}" for run, ratio in blocks.items())


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


def claims_table(runs: pd.DataFrame, arms: pd.DataFrame, config: dict) -> pd.DataFrame:
    rows = []
    for claim in config.get("claims") or []:
        judge = judge_ratio if claim_kind(claim) == "ratio" else judge_within
        row = judge(claim, runs, arms, config)
        row["sentence"] = (
            f"{claim['statement']}: {row['verdict']} here, a {row['judged_as']} of "
            f"a bound from {SOURCE_WORDS[claim['bound_from']['kind']]} "
            f"({row['detail']})"
        )
        rows.append(row)
    columns = [
        "claim",
        "kind",
        "statement",
        "metric",
        "arms",
        "verdict",
        "judged_as",
        "bound_from",
        "value",
        "bound",
        "reference_value",
        "detail",
        "sentence",
    ]
    return pd.DataFrame(rows, columns=columns)


def judge_ratio(claim: dict, runs, arms, config) -> dict:
    ratio = ratio_row(claim, runs, arms, config)
    value, study = ratio["ratio_of_medians"], ratio["reference_ratio"]
    bound = describe_ratio_bound(claim)
    row = _claim_row(claim, bound, value, study)
    study_text = f"; study {study:.3g}x" if is_number(study) else ""
    if shortfall := too_few_runs(claim, arms):
        return row | {"verdict": CANNOT_TELL, "detail": shortfall + study_text}
    if not is_number(value):
        detail = (
            f"no ratio: the {claim['denominator']} median of {claim['metric']} "
            f"is {ratio['denominator_median']}{study_text}"
        )
        return row | {"verdict": CANNOT_TELL, "detail": detail}
    holds = ratio_within_bounds(value, claim)
    blocks = block_ratios(
        runs, claim["numerator"], claim["denominator"], claim["metric"]
    )
    agreeing = sum(ratio_within_bounds(block, claim) for block in blocks.values())
    block_text = f"; {agreeing} of {len(blocks)} paired runs meet it" if blocks else ""
    shortfall_text = "" if holds else f", the claim needs {bound}"
    detail = f"{value:.3g}x{shortfall_text}{block_text}{study_text}"
    return row | {"verdict": HOLDS if holds else DOES_NOT_HOLD, "detail": detail}


def judge_within(claim: dict, runs, arms, config) -> dict:
    metric = claim["metric"]
    tolerance = float(claim["tolerance"])
    medians = [arm_median(arms, arm, metric) for arm in claim["arms"]]
    study = claim.get("reference_spread")
    if study is None:
        references = reference_values(config)
        study_values = [references.get((arm, metric)) for arm in claim["arms"]]
        study = spread(study_values) if None not in study_values else math.nan
    study_text = f"; study {study:.1%}" if is_number(study) else ""
    row = _claim_row(claim, f"spread at most {tolerance:.0%}", math.nan, study)
    shortfall = too_few_runs(claim, arms)
    if shortfall or not all(is_number(median) for median in medians):
        detail = (shortfall or f"an arm has no {metric} value") + study_text
        return row | {"verdict": CANNOT_TELL, "detail": detail}
    value = spread(medians)
    if not is_number(value):
        detail = f"an arm's median {metric} is not positive{study_text}"
        return row | {"verdict": CANNOT_TELL, "detail": detail}
    detail = (
        f"{', '.join(claim['arms'])}: medians {format_number(min(medians))} to "
        f"{format_number(max(medians))} {METRICS[metric].unit}, spread {value:.1%}, "
        f"allowed {tolerance:.0%}{study_text}"
    )
    verdict = HOLDS if value <= tolerance else DOES_NOT_HOLD
    return row | {"value": value, "verdict": verdict, "detail": detail}


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
    bounds = {"at least": claim.get("at_least"), "at most": claim.get("at_most")}
    return " and ".join(
        f"{words} {bound:g}x" for words, bound in bounds.items() if bound is not None
    )


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


def describe_source(source: BoundSource) -> str:
    """ "a pilot: <which>; <its figures>; committed in <commit>:<path>"."""
    parts = [f"{SOURCE_WORDS[source.kind]}: {source.what}", source.result]
    if source.kind not in TESTED_KINDS:
        where = source.committed
        parts.append(f"committed in {where}" if where else "not committed")
    return "; ".join(part for part in parts if part)


def _claim_row(claim: dict, bound: str, value: float, reference: float) -> dict:
    source = BoundSource.from_config(claim["bound_from"])
    return {
        "claim": claim["name"],
        "kind": claim_kind(claim),
        "statement": claim["statement"],
        "metric": claim["metric"],
        "arms": ", ".join(claim_arms(claim)),
        "judged_as": "test" if source.kind in TESTED_KINDS else "confirmation",
        "bound_from": describe_source(source),
        "bound": bound,
        "value": value,
        "reference_value": reference,
    }
