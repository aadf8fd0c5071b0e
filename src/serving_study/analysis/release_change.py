"""Did a figure change from one code version to the next, beyond run-to-run spread?

One criterion serves two searches: the release series (the arms of an experiment
are consecutive releases, and the report marks the first release that changed),
and the commit bisect (each probed commit is compared with the two ends).

**The criterion.** Two versions *differ beyond the run-to-run spread* in a figure
when both of these hold over their valid runs:

1. their [min, max] ranges do not overlap: every run of one version is above every
   run of the other;
2. the larger median is at least ``1 + min_change`` times the smaller one.

With fewer than ``min_valid_runs`` valid runs on either side the answer is
"cannot tell".

**Why this definition.** The [min, max] range is the spread the report already
shows beside every median, so a reader can check a verdict by eye. It assumes no
distribution: if two versions really perform alike, their n and m runs are
exchangeable, and the chance that the ranges still fall apart is exactly
``2 * n! * m! / (n + m)!``: 10% for 3 runs against 3, 2.9% for 4 against 4,
0.8% for 5 against 5 (``false_alarm_chance``), and the report states it. A
series of k releases makes k - 1 such comparisons, so its "first change" can be
a false alarm in up to the sum of their chances (``series_false_alarm_bound``),
which the report states beside it. The
alternative, a ratio of medians beyond the larger of the two relative spreads,
has no such number: how often it fires by chance depends on the shape of the
runs' distribution, which three runs cannot tell. Rule 2 is a floor for
practical size: runs can be so steady that slow drift of the host (a percent or
two over the series) separates the ranges, and such a "change" is not what a user
bisecting a throughput regression looks for.

What the criterion cannot do is see through drift: when the host slows from one
repetition block to the next, every version's range widens by the drift and a
real change can hide in the overlap. The releases table therefore shows the
ratio within each block beside the verdict (not in it), where drift cancels.
"""

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Self

import pandas as pd

from serving_study.analysis.claims import block_ratios, describe_block_ratios
from serving_study.analysis.numbers import is_number
from serving_study.config.schema import property_schema
from serving_study.metric_catalogue import METRICS

CHANGED = "changed"
NO_CHANGE = "no change"
CANNOT_TELL = "cannot tell"

# The figures the release series compares and plots, besides the criterion's own.
SERIES_METRICS = ("throughput_rps", "main_cpu_percent")

RELEASE_COLUMNS = (
    "position",
    "release",
    "arm",
    "metric",
    "label",
    "unit",
    "runs",
    "median",
    "min",
    "max",
    "compared_with",
    "ratio",
    "block_ratios",
    "verdict",
    "first_change",
    "detail",
)


@dataclass(frozen=True)
class ChangeCriterion:
    """The settings of the criterion (config key ``change_criterion``)."""

    metric: str = property_schema("change_criterion", "metric")["default"]
    min_change: float = property_schema("change_criterion", "min_change")["default"]
    min_valid_runs: int = property_schema("change_criterion", "min_valid_runs")[
        "default"
    ]

    @classmethod
    def from_config(cls, settings: dict | None) -> Self:
        settings = settings or {}
        defaults = cls()
        return cls(
            metric=settings.get("metric", defaults.metric),
            min_change=float(settings.get("min_change", defaults.min_change)),
            min_valid_runs=int(settings.get("min_valid_runs", defaults.min_valid_runs)),
        )


@dataclass(frozen=True)
class Spread:
    """One version's figure over its valid runs: median and [min, max]."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of_values(cls, values: Iterable[float]) -> Self:
        numbers = [float(value) for value in values if is_number(value)]
        if not numbers:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(numbers), min(numbers), max(numbers), len(numbers))

    @classmethod
    def of_arm(cls, arms: pd.DataFrame, arm: str, metric: str) -> Self:
        """Read one arm's figure from the aggregated ``arms`` table."""
        rows = arms[(arms["arm"] == arm) & (arms["metric"] == metric)]
        if rows.empty:
            return cls(math.nan, math.nan, math.nan, 0)
        row = rows.iloc[0]
        return cls(
            float(row["median"]),
            float(row["min"]),
            float(row["max"]),
            int(row["n_values"]),
        )

    def as_dict(self) -> dict:
        return {
            "median": _finite_or_none(self.median),
            "min": _finite_or_none(self.low),
            "max": _finite_or_none(self.high),
            "runs": self.runs,
        }


@dataclass(frozen=True)
class Comparison:
    """The criterion's answer for a later version against an earlier one."""

    verdict: str
    ratio: float
    detail: str

    @property
    def changed(self) -> bool:
        return self.verdict == CHANGED

    def as_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "ratio": _finite_or_none(self.ratio),
            "detail": self.detail,
        }


def compare(earlier: Spread, later: Spread, criterion: ChangeCriterion) -> Comparison:
    """Apply the criterion (module docstring) to two versions' spreads."""
    needed = criterion.min_valid_runs
    if earlier.runs < needed or later.runs < needed:
        return Comparison(
            CANNOT_TELL,
            math.nan,
            f"{earlier.runs} and {later.runs} valid runs; the criterion needs "
            f"{needed} on each side",
        )
    if earlier.median <= 0 or later.median <= 0:
        return Comparison(
            CANNOT_TELL, math.nan, "a median is not positive, so no ratio"
        )
    ratio = later.median / earlier.median
    apart = later.low > earlier.high or later.high < earlier.low
    large_enough = max(ratio, 1 / ratio) >= 1 + criterion.min_change
    ranges = (
        f"[{earlier.low:.4g}, {earlier.high:.4g}] then "
        f"[{later.low:.4g}, {later.high:.4g}]"
    )
    if apart and large_enough:
        return Comparison(CHANGED, ratio, f"ranges {ranges} apart")
    if not apart:
        reason = f"ranges {ranges} overlap"
    else:
        reason = (
            f"ranges {ranges} apart, but below the {criterion.min_change:.0%} "
            "smallest change"
        )
    return Comparison(NO_CHANGE, ratio, reason)


def false_alarm_chance(runs_before: int, runs_after: int) -> float:
    """How often ranges of n and m exchangeable runs fall apart by chance alone."""
    if runs_before < 1 or runs_after < 1:
        return math.nan
    orderings = math.factorial(runs_before) * math.factorial(runs_after)
    return 2 * orderings / math.factorial(runs_before + runs_after)


def any_false_alarm_bound(chances: Iterable[float]) -> float:
    """At most how often any of several comparisons falls apart by chance alone,
    given each one's own chance: their sum, capped at 1 (it holds however the
    comparisons depend on each other)."""
    return min(1.0, sum(chances))


# --- the release series -----------------------------------------------------------


def release_labels(config: dict) -> list[tuple[str, str]]:
    """(arm, release) in the config's order, which is the release order.

    A release is named by its source: the PyPI version, else the first 12 digits
    of the git commit, else the arm's name.
    """
    variants = {variant["name"]: variant for variant in config.get("variants", [])}
    sources = {source["name"]: source for source in config.get("sources", [])}
    labels = []
    for arm in config["arms"]:
        variant = variants.get(arm.get("variant"), {})
        source = sources.get(variant.get("source"), {})
        if "pypi" in source:
            label = str(source["pypi"]["version"])
        elif "git" in source:
            label = str(source["git"]["commit"])[:12]
        else:
            label = arm["name"]
        labels.append((arm["name"], label))
    return labels


def releases_table(
    arms: pd.DataFrame,
    runs: pd.DataFrame,
    releases: Sequence[tuple[str, str]],
    criterion: ChangeCriterion,
    metrics: Sequence[str] = SERIES_METRICS,
) -> pd.DataFrame:
    """Each release against the one before it, for each figure.

    ``releases`` are (arm, release) in release order. A release is compared with
    the nearest earlier release that has enough valid runs, so one release that
    could not be measured does not hide a change behind it. ``first_change``
    marks, per figure, the first release that changed; ``block_ratios`` are for
    reading only (module docstring).
    """
    rows = []
    for metric in dict.fromkeys([criterion.metric, *metrics]):
        before: tuple[str, str, Spread] | None = None
        found_first = False
        for position, (arm, release) in enumerate(releases, start=1):
            spread = Spread.of_arm(arms, arm, metric)
            row = {
                "position": position,
                "release": release,
                "arm": arm,
                "metric": metric,
                "label": METRICS[metric].label,
                "unit": METRICS[metric].unit,
                "runs": spread.runs,
                "median": spread.median,
                "min": spread.low,
                "max": spread.high,
                "compared_with": None,
                "ratio": math.nan,
                "block_ratios": "",
                "verdict": None,
                "first_change": False,
                "detail": "first release of the series",
            }
            if before is not None:
                earlier_release, earlier_arm, earlier = before
                comparison = compare(earlier, spread, criterion)
                row.update(
                    compared_with=earlier_release,
                    ratio=comparison.ratio,
                    block_ratios=describe_block_ratios(
                        block_ratios(runs, arm, earlier_arm, metric)
                    ),
                    verdict=comparison.verdict,
                    detail=comparison.detail,
                )
                if comparison.changed and not found_first:
                    row["first_change"] = found_first = True
            if spread.runs >= criterion.min_valid_runs:
                before = (release, arm, spread)
            elif before is None:
                row["detail"] = (
                    f"{spread.runs} valid runs: too few to compare with what follows"
                )
            rows.append(row)
    table = pd.DataFrame(rows, columns=list(RELEASE_COLUMNS))
    return table.astype({"first_change": bool})


def first_change(releases: pd.DataFrame, metric: str) -> dict | None:
    """The row of the first release whose ``metric`` changed, or None."""
    if releases.empty:
        return None
    rows = releases[(releases["metric"] == metric) & releases["first_change"]]
    return rows.iloc[0].to_dict() if len(rows) else None


def series_false_alarm_bound(releases: pd.DataFrame, metric: str) -> tuple[int, float]:
    """The comparisons the series made of ``metric``, and at most how often any of
    them would fall apart by chance alone in a series where no release changed: the
    sum of each comparison's own chance (its two releases' valid runs), capped at 1.
    A "first change" is wrong at most that often, not at one comparison's rate."""
    rows = releases[releases["metric"] == metric]
    runs_of = dict(zip(rows["release"], rows["runs"], strict=True))
    compared = rows[rows["verdict"].isin([CHANGED, NO_CHANGE])]
    chances = [
        false_alarm_chance(int(runs_of[row["compared_with"]]), int(row["runs"]))
        for row in compared.to_dict("records")
    ]
    return len(chances), any_false_alarm_bound(chances)


def describe_first_change(releases: pd.DataFrame, metric: str) -> str:
    """One sentence for the report: where ``metric`` first changed, if anywhere,
    and how often the series' comparisons together would find a change by chance."""
    label = METRICS[metric].label
    row = first_change(releases, metric)
    comparisons, bound = series_false_alarm_bound(releases, metric)
    error_rate = (
        f" Over the series' {comparisons} comparison{'s' if comparisons != 1 else ''},"
        f" releases that all perform alike would show a change somewhere by chance "
        f"in at most {bound:.0%} of series."
        if comparisons
        else ""
    )
    if row is None:
        rows = releases[releases["metric"] == metric]
        untold = int((rows["verdict"] == CANNOT_TELL).sum())
        untold_text = (
            f" ({untold} comparison{'s' if untold != 1 else ''} could not tell)"
            if untold
            else ""
        )
        return (
            f"No release changed {label} beyond the run-to-run spread{untold_text}."
            f"{error_rate}"
        )
    return (
        f"{label} first changed in {row['release']}: {row['ratio']:.3g}x the "
        f"median of {row['compared_with']}, {row['detail']}.{error_rate}"
    )


def _finite_or_none(value: float) -> float | None:
    return float(value) if is_number(value) else None
