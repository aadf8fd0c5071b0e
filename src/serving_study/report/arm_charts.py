"""Figures 1 and 4, numbered after the study's own, from the arms and runs tables:
throughput against concurrency, and the arms side by side with the study's numbers
(figures.py captions what each shows).
"""

import math
from collections.abc import Sequence

import altair as alt
import pandas as pd

from serving_study.analysis.summaries import describe_environment
from serving_study.config.open_loop import describe_arrivals
from serving_study.config.records import Arm, quota_value
from serving_study.metric_catalogue import METRICS
from serving_study.report.figures import FIGURE_TITLES
from serving_study.report.formatting import metric_heading
from serving_study.report.tables import metrics_with_numbers

REPRODUCTION = "reproduction"
STUDY = "study"
SOURCE_COLORS = {REPRODUCTION: "#3b6ea8", STUDY: "#c9a227"}

COMPARISON_METRICS = (
    "throughput_rps",
    "ttft_p50_ms",
    "main_cpu_percent",
    "gpu_util_percent",
)


def series_labels(arms: Sequence[Arm]) -> dict[str, str]:
    """Name each arm's line: its transport, plus whatever else sets arms apart.

    Arms that differ only in concurrency share a line; when arms of one
    transport also differ in variant, quota, environment or request rate, those
    attributes are added to the label so that the lines stay apart.
    """

    def describe(arm: Arm, attribute: str) -> str:
        if attribute == "environment":
            return describe_environment(arm.environment)
        if attribute == "cpu_quota":
            return f"quota {quota_value(arm.cpu_quota)}"
        if attribute == "arrivals":
            return describe_arrivals(arm.request_rate, arm.burstiness)
        return str(getattr(arm, attribute))

    varying = ["transport"] + [
        attribute
        for attribute in ("variant", "cpu_quota", "environment", "arrivals")
        if len({describe(arm, attribute) for arm in arms}) > 1
    ]
    return {
        arm.name: ", ".join(describe(arm, attribute) for attribute in varying)
        for arm in arms
    }


def beside_the_study(summary: pd.DataFrame) -> pd.DataFrame:
    """Each arm's median (source: reproduction) and the study's number for it
    (source: study), as one value column; without the values neither has."""
    reproduction = summary.assign(source=REPRODUCTION, value=summary["median"])
    study = summary.assign(
        source=STUDY, value=summary["reference"], min=math.nan, max=math.nan
    )
    return pd.concat([reproduction, study]).dropna(subset=["value"])


def throughput_vs_concurrency(
    tables: dict[str, pd.DataFrame], arms: Sequence[Arm]
) -> dict:
    metric = "throughput_rps"
    labels = series_labels(arms)
    concurrency = {arm.name: arm.concurrency for arm in arms}

    arm_table = tables["arms"]
    summary = arm_table[arm_table["metric"] == metric]
    lines = beside_the_study(summary.assign(series=summary["arm"].map(labels)))
    lines = lines[["arm", "series", "concurrency", "source", "value", "min", "max"]]

    runs = tables["runs"]
    points = runs[runs["valid"] & runs[metric].notna()].copy()
    points["series"] = points["arm"].map(labels)
    points["concurrency"] = points["arm"].map(concurrency)
    points = points[["arm", "run", "series", "concurrency", metric]]

    ticks = sorted(set(concurrency.values()))
    x = alt.X(
        "concurrency:Q",
        scale=alt.Scale(type="log", base=2),
        axis=alt.Axis(values=ticks, format="d"),
        title="concurrency (requests in flight)",
    )
    color = alt.Color("series:N", title="arms")
    line = (
        alt.Chart(lines)
        .mark_line()
        .encode(
            x=x,
            y=alt.Y("value:Q", title=metric_heading(metric)),
            color=color,
            strokeDash=alt.StrokeDash(
                "source:N",
                scale=alt.Scale(domain=[REPRODUCTION, STUDY], range=[[1, 0], [4, 3]]),
                title="numbers from",
            ),
            detail="source:N",
        )
    )
    markers = (
        alt.Chart(lines)
        .mark_point(filled=True, size=60)
        .encode(
            x=x,
            y="value:Q",
            color=color,
            shape=alt.Shape(
                "source:N",
                scale=alt.Scale(
                    domain=[REPRODUCTION, STUDY], range=["circle", "diamond"]
                ),
                title="numbers from",
            ),
            tooltip=[
                "arm",
                "series",
                "concurrency",
                "source",
                alt.Tooltip("value:Q", format=".3g"),
                alt.Tooltip("min:Q", format=".3g"),
                alt.Tooltip("max:Q", format=".3g"),
            ],
        )
    )
    spread = (
        alt.Chart(lines[lines["source"] == REPRODUCTION])
        .mark_rule()
        .encode(x=x, y="min:Q", y2="max:Q", color=color)
    )
    runs_layer = (
        alt.Chart(points)
        .mark_circle(size=30, opacity=0.5)
        .encode(
            x=x,
            y=alt.Y(f"{metric}:Q"),
            color=color,
            tooltip=["arm", "run", alt.Tooltip(f"{metric}:Q", format=".3g")],
        )
    )
    chart = alt.layer(spread, line, markers, runs_layer).properties(
        width=420, height=300, title=FIGURE_TITLES["throughput_vs_concurrency"]
    )
    return chart.to_dict()


def arm_comparison(tables: dict[str, pd.DataFrame], arm_order: list[str]) -> dict:
    metrics = metrics_with_numbers(tables["arms"], COMPARISON_METRICS)
    if not metrics:
        metrics = ["throughput_rps"]
    panels = [comparison_panel(tables, metric, arm_order) for metric in metrics]
    rows = [
        alt.hconcat(*panels[start : start + 2]) for start in range(0, len(panels), 2)
    ]
    chart = alt.vconcat(*rows).properties(title=FIGURE_TITLES["arm_comparison"])
    return chart.resolve_scale(color="shared").to_dict()


def comparison_panel(
    tables: dict[str, pd.DataFrame], metric: str, arm_order
) -> alt.LayerChart:
    arms = tables["arms"]
    bars = beside_the_study(arms[arms["metric"] == metric])
    bars = bars[["arm", "environment", "variant", "source", "value", "min", "max"]]

    runs = tables["runs"]
    points = runs[runs["valid"] & runs[metric].notna()][["arm", "run", metric]]
    points = points.assign(source=REPRODUCTION)

    # Short arm names (A, B, ...) read best level; long ones need tilting.
    tilt = 0 if max(len(name) for name in arm_order) <= 8 else -30
    x = alt.X("arm:N", sort=arm_order, title=None, axis=alt.Axis(labelAngle=tilt))
    offset = alt.XOffset("source:N", scale=alt.Scale(domain=[REPRODUCTION, STUDY]))
    color = alt.Color(
        "source:N",
        scale=alt.Scale(domain=list(SOURCE_COLORS), range=list(SOURCE_COLORS.values())),
        title="numbers from",
    )
    bar_layer = (
        alt.Chart(bars)
        .mark_bar()
        .encode(
            x=x,
            xOffset=offset,
            y=alt.Y("value:Q", title=metric_heading(metric)),
            color=color,
            tooltip=[
                "arm",
                "variant",
                "environment",
                "source",
                alt.Tooltip("value:Q", format=".3g"),
                alt.Tooltip("min:Q", format=".3g"),
                alt.Tooltip("max:Q", format=".3g"),
            ],
        )
    )
    spread_layer = (
        alt.Chart(bars[bars["source"] == REPRODUCTION])
        .mark_rule(color="black")
        .encode(x=x, xOffset=offset, y="min:Q", y2="max:Q")
    )
    points_layer = (
        alt.Chart(points)
        .mark_circle(color="black", size=25, opacity=0.7)
        .encode(
            x=x,
            xOffset=offset,
            y=f"{metric}:Q",
            tooltip=["arm", "run", alt.Tooltip(f"{metric}:Q", format=".3g")],
        )
    )
    width = max(160, 55 * len(arm_order))
    return alt.layer(bar_layer, spread_layer, points_layer).properties(
        width=width, height=200, title=METRICS[metric].label
    )
