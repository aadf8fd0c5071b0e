"""The report's charts, built with altair from the aggregated tables.

Two figures, numbered after the study's own:

- Figure 1, `throughput_vs_concurrency`: median throughput against
  concurrency, one line per transport (and per variant or environment where
  arms differ in those too), with every valid run and the study's numbers.
- Figure 4, `arm_comparison`: per arm, bars for throughput, TTFT p50,
  main-process CPU and (when measured) GPU utilization. Each panel puts the
  reproduction's median with its [min, max] and run points beside the study's
  reference value.

With `release_series` set, a third figure, `release_series`, plots
throughput and main-process CPU per release in release order and marks the
first release that changed (release_change.py). With a `thread_quota_map`,
`thread_quota_map` draws the map's throughput as one heatmap per variant
(intra-op threads across, quota down), and with two variants their ratio.

Charts are returned as Vega-Lite specs (dicts) so that the report can embed
them and also keep them as `.vl.json` files.
"""

import math

import altair as alt
import pandas as pd

from serving_study.analysis.aggregate import (
    MAP_TABLE,
    RELEASE_TABLE,
    describe_environment,
)
from serving_study.analysis.fix_comparison import FIXES_TABLE, fixes_chart_spec
from serving_study.analysis.release_change import CANNOT_TELL, CHANGED, NO_CHANGE
from serving_study.measure.run_metrics import METRICS

REPRODUCTION = "reproduction"
STUDY = "study"
SOURCE_COLORS = {REPRODUCTION: "#3b6ea8", STUDY: "#c9a227"}

COMPARISON_METRICS = (
    "throughput_rps",
    "ttft_p50_ms",
    "main_cpu_percent",
    "gpu_util_percent",
)

FIGURE_TITLES = {
    "throughput_vs_concurrency": "Figure 1: throughput against concurrency",
    "arm_comparison": "Figure 4: arms side by side, with the study's numbers",
    "release_series": "Releases in order: throughput and main-process CPU",
    "thread_quota_map": "Throughput over intra-op threads and CPU quota",
    "which_fix": "Which fix: throughput under the quota, by fix",
}

# How each release compares with the one before it, as the release figure colors it.
VERDICT_COLORS = {
    "first release": "#777777",
    NO_CHANGE: "#3b6ea8",
    CHANGED: "#c0392b",
    CANNOT_TELL: "#c9a227",
}


def chart_specs(tables: dict[str, pd.DataFrame], config: dict) -> dict[str, dict]:
    """Every figure as a Vega-Lite spec, keyed by figure name."""
    specs = {
        "throughput_vs_concurrency": throughput_vs_concurrency(tables, config),
        "arm_comparison": arm_comparison(tables, config),
    }
    if is_release_series(config, tables):
        specs["release_series"] = release_series(tables)
    if MAP_TABLE in tables:
        specs["thread_quota_map"] = thread_quota_map(tables[MAP_TABLE])
    if FIXES_TABLE in tables:
        specs["which_fix"] = fixes_chart_spec(tables[FIXES_TABLE])
    return specs


def is_release_series(config: dict, tables: dict[str, pd.DataFrame]) -> bool:
    return bool(config.get("release_series")) and RELEASE_TABLE in tables


def has_several_concurrencies(config: dict) -> bool:
    return len({arm.get("concurrency") for arm in config["arms"]}) > 1


def axis_title(metric: str) -> str:
    info = METRICS[metric]
    return f"{info.label} ({info.unit})"


def series_labels(config: dict) -> dict[str, str]:
    """Name each arm's line: its transport, plus whatever else sets arms apart.

    Arms that differ only in concurrency share a line; when arms of one
    transport also differ in variant, quota or environment, those attributes
    are added to the label so that the lines stay apart.
    """

    def describe(arm: dict, attribute: str) -> str:
        if attribute == "environment":
            return describe_environment(arm.get("environment"))
        if attribute == "cpu_quota":
            return f"quota {arm.get('cpu_quota')}"
        return str(arm.get(attribute))

    varying = ["transport"] + [
        attribute
        for attribute in ("variant", "cpu_quota", "environment")
        if len({describe(arm, attribute) for arm in config["arms"]}) > 1
    ]
    return {
        arm["name"]: ", ".join(describe(arm, attribute) for attribute in varying)
        for arm in config["arms"]
    }


def throughput_vs_concurrency(tables: dict[str, pd.DataFrame], config: dict) -> dict:
    metric = "throughput_rps"
    labels = series_labels(config)
    concurrency = {arm["name"]: arm.get("concurrency") for arm in config["arms"]}

    arms = tables["arms"]
    summary = arms[arms["metric"] == metric].copy()
    summary["series"] = summary["arm"].map(labels)
    lines = pd.concat(
        [
            summary.assign(source=REPRODUCTION, value=summary["median"]),
            summary.assign(
                source=STUDY, value=summary["reference"], min=math.nan, max=math.nan
            ),
        ]
    )
    lines = lines.dropna(subset=["value"])
    lines = lines[["arm", "series", "concurrency", "source", "value", "min", "max"]]

    runs = tables["runs"]
    points = runs[runs["valid"] & runs[metric].notna()].copy()
    points["series"] = points["arm"].map(labels)
    points["concurrency"] = points["arm"].map(concurrency)
    points = points[["arm", "run", "series", "concurrency", metric]]

    ticks = sorted({c for c in concurrency.values() if c is not None})
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
            y=alt.Y("value:Q", title=axis_title(metric)),
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
        width=420,
        height=300,
        title=FIGURE_TITLES["throughput_vs_concurrency"],
    )
    return chart.to_dict()


def arm_comparison(tables: dict[str, pd.DataFrame], config: dict) -> dict:
    arm_order = [arm["name"] for arm in config["arms"]]
    arms = tables["arms"]
    metrics = [
        metric
        for metric in COMPARISON_METRICS
        if arms.loc[arms["metric"] == metric, ["median", "reference"]]
        .notna()
        .any()
        .any()
    ]
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
    summary = arms[arms["metric"] == metric]
    bars = pd.concat(
        [
            summary.assign(source=REPRODUCTION, value=summary["median"]),
            summary.assign(
                source=STUDY, value=summary["reference"], min=math.nan, max=math.nan
            ),
        ]
    ).dropna(subset=["value"])
    bars = bars[["arm", "environment", "variant", "source", "value", "min", "max"]]

    runs = tables["runs"]
    points = runs[runs["valid"] & runs[metric].notna()][["arm", "run", metric]].copy()
    points["source"] = REPRODUCTION

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
            y=alt.Y("value:Q", title=axis_title(metric)),
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


def release_series(tables: dict[str, pd.DataFrame]) -> dict:
    """Per figure of the releases table, one panel: releases in order on x."""
    releases = tables[RELEASE_TABLE]
    order = list(dict.fromkeys(releases.sort_values("position")["release"]))
    panels = [
        release_panel(releases[releases["metric"] == metric], tables["runs"], order)
        for metric in dict.fromkeys(releases["metric"])
    ]
    chart = alt.vconcat(*panels).properties(title=FIGURE_TITLES["release_series"])
    return chart.resolve_scale(color="shared").to_dict()


def release_panel(
    rows: pd.DataFrame, runs: pd.DataFrame, order: list[str]
) -> alt.LayerChart:
    metric = rows["metric"].iloc[0]
    summary = rows.assign(
        verdict=rows["verdict"].fillna("first release"),
        compared_with=rows["compared_with"].fillna(""),
    )[
        [
            "release",
            "arm",
            "median",
            "min",
            "max",
            "verdict",
            "compared_with",
            "ratio",
            "detail",
        ]
    ].dropna(subset=["median"])
    release_of_arm = dict(zip(rows["arm"], rows["release"], strict=True))
    valid = runs[runs["valid"].astype(bool) & runs[metric].notna()]
    points = valid[valid["arm"].isin(release_of_arm)][["arm", "run", metric]].copy()
    points["release"] = points["arm"].map(release_of_arm)

    tilt = 0 if len(order) <= 6 else -45
    x = alt.X("release:N", sort=order, title="release", axis=alt.Axis(labelAngle=tilt))
    y_title = axis_title(metric)
    color = alt.Color(
        "verdict:N",
        scale=alt.Scale(
            domain=list(VERDICT_COLORS), range=list(VERDICT_COLORS.values())
        ),
        title="against the release before",
    )
    line = (
        alt.Chart(summary)
        .mark_line(color="#999999")
        .encode(x=x, y=alt.Y("median:Q", title=y_title))
    )
    spread = alt.Chart(summary).mark_rule().encode(x=x, y="min:Q", y2="max:Q")
    runs_layer = (
        alt.Chart(points)
        .mark_circle(color="black", size=20, opacity=0.5)
        .encode(
            x=x,
            y=f"{metric}:Q",
            tooltip=["release", "run", alt.Tooltip(f"{metric}:Q", format=".3g")],
        )
    )
    medians = (
        alt.Chart(summary)
        .mark_point(filled=True, size=80)
        .encode(
            x=x,
            y="median:Q",
            color=color,
            tooltip=[
                "release",
                alt.Tooltip("median:Q", format=".3g"),
                alt.Tooltip("min:Q", format=".3g"),
                alt.Tooltip("max:Q", format=".3g"),
                "compared_with",
                alt.Tooltip("ratio:Q", format=".3g"),
                "detail",
            ],
        )
    )
    layers = [spread, line, runs_layer, medians]
    first = rows[rows["first_change"].astype(bool)]
    if len(first):
        change = first.iloc[0]
        marker = pd.DataFrame(
            [
                {
                    "release": change["release"],
                    "text": f"first change: {change['release']} "
                    f"({change['ratio']:.3g}x {change['compared_with']})",
                }
            ]
        )
        layers.append(
            alt.Chart(marker)
            .mark_rule(color=VERDICT_COLORS[CHANGED], strokeDash=[4, 3])
            .encode(x=x)
        )
        layers.append(
            alt.Chart(marker)
            .mark_text(
                align="left",
                baseline="top",
                dx=4,
                y=2,
                color=VERDICT_COLORS[CHANGED],
            )
            .encode(x=x, text="text:N")
        )
    width = max(240, 38 * len(order))
    return alt.layer(*layers).properties(
        width=width, height=180, title=METRICS[metric].label
    )


# --- the thread x quota map ---------------------------------------------------------


def quota_order(quotas) -> list[str]:
    """Quotas from the smallest to none (no quota)."""
    numbers = sorted({q for q in quotas if q != "none"}, key=float)
    return numbers + (["none"] if "none" in set(quotas) else [])


def thread_quota_map(cells: pd.DataFrame) -> dict:
    """One throughput heatmap per variant; with two variants, also their ratio."""
    cells = cells.assign(cpu_quota=cells["cpu_quota"].astype(str))
    threads = sorted(int(t) for t in cells["intra_op_threads"].unique())
    quotas = quota_order(cells["cpu_quota"])
    variants = list(dict.fromkeys(cells["variant"]))
    x = alt.X("intra_op_threads:O", sort=threads, title="intra-op threads (forced)")
    y = alt.Y("cpu_quota:O", sort=quotas, title="CPU quota (cores)")
    # Every variant on one scale from zero (1 when no cell was valid).
    top = cells["throughput_rps"].max()
    top = top if pd.notna(top) else 1
    panels = [
        heatmap_panel(
            cells[cells["variant"] == variant],
            x,
            y,
            "throughput_rps",
            alt.Scale(scheme="viridis", domain=[0, top]),
            f"{variant}: throughput (req/s)",
        )
        for variant in variants
    ]
    if len(variants) == 2:
        first, second = variants
        paired = cells.pivot_table(
            index=["intra_op_threads", "cpu_quota"],
            columns="variant",
            values="throughput_rps",
        ).reset_index()
        if first in paired and second in paired:
            paired["ratio"] = paired[second] / paired[first]
            paired = paired.dropna(subset=["ratio"])
            panels.append(
                heatmap_panel(
                    paired,
                    x,
                    y,
                    "ratio",
                    alt.Scale(scheme="blueorange", domainMid=1, type="log"),
                    f"{second} / {first} throughput",
                )
            )
    chart = alt.hconcat(*panels).properties(title=FIGURE_TITLES["thread_quota_map"])
    return chart.resolve_scale(color="independent").to_dict()


def heatmap_panel(
    data: pd.DataFrame, x, y, value: str, scale: alt.Scale, title: str
) -> alt.LayerChart:
    """Colored cells with their value written in; cells without a value stay empty."""
    data = data[["intra_op_threads", "cpu_quota", value]].dropna(subset=[value])
    base = alt.Chart(data).encode(x=x, y=y)
    cells = base.mark_rect().encode(
        color=alt.Color(
            f"{value}:Q", scale=scale, title=None, legend=alt.Legend(format=".3g")
        ),
        tooltip=[
            "intra_op_threads",
            "cpu_quota",
            alt.Tooltip(f"{value}:Q", format=".3g"),
        ],
    )
    labels = base.mark_text(fontSize=9, color="white").encode(
        text=alt.Text(f"{value}:Q", format=".3g")
    )
    return alt.layer(cells, labels).properties(width=260, height=170, title=title)
