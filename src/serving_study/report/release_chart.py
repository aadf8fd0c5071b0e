"""The release series figure: throughput and main-process CPU per release, in
release order, with the first release that changed marked (release_change.py
judges the change)."""

import altair as alt
import pandas as pd

from serving_study.analysis.aggregate import RELEASE_TABLE
from serving_study.analysis.release_change import CANNOT_TELL, CHANGED, NO_CHANGE
from serving_study.metric_catalogue import METRICS
from serving_study.report.figures import FIGURE_TITLES
from serving_study.report.formatting import metric_heading

# How each release compares with the one before it, as the release figure colors it.
VERDICT_COLORS = {
    "first release": "#777777",
    NO_CHANGE: "#3b6ea8",
    CHANGED: "#c0392b",
    CANNOT_TELL: "#c9a227",
}


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
        .encode(x=x, y=alt.Y("median:Q", title=metric_heading(metric)))
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
        text = (
            f"first change: {change['release']} "
            f"({change['ratio']:.3g}x {change['compared_with']})"
        )
        marker = alt.Chart(pd.DataFrame([{"release": change["release"], "text": text}]))
        changed = VERDICT_COLORS[CHANGED]
        layers += [
            marker.mark_rule(color=changed, strokeDash=[4, 3]).encode(x=x),
            marker.mark_text(
                align="left", baseline="top", dx=4, y=2, color=changed
            ).encode(x=x, text="text:N"),
        ]
    width = max(240, 38 * len(order))
    return alt.layer(*layers).properties(
        width=width, height=180, title=METRICS[metric].label
    )
