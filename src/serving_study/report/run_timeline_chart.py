"""The figure of one representative run per arm over its measured window
(analysis/run_timelines.py chooses the run and bins the series): TTFT per request,
main-process CPU and throttled share, one column per variant, so that arms that
differ only in their variant (the original copy and the patched one, A and C) sit
side by side in one row, on one time axis and one scale per panel."""

import dataclasses
from collections.abc import Sequence

import altair as alt
import pandas as pd

from serving_study.analysis.run_timelines import MAIN_CPU, THROTTLED, TTFT
from serving_study.config.records import Arm
from serving_study.report.figures import FIGURE_TITLES

PANELS = {
    TTFT: "TTFT (ms)",
    MAIN_CPU: "main-process CPU (%)",
    THROTTLED: "throttled share",
}
# Digits kept in the page: a millisecond of time, a tenth of a ms or percent.
DECIMALS = {"t_s": 3, TTFT: 1, MAIN_CPU: 1, THROTTLED: 3}
WIDTH, HEIGHT = 260, 70
# What may differ between the arms of one row.
IGNORED = ("name", "variant")


def rows_of_arms(arms: Sequence[Arm]) -> tuple[list[str], list[dict[str, Arm]]]:
    """The variants in the arms' order, and the arms in rows: one row per set of
    settings but the variant, each arm in its variant's column."""
    variants = list(dict.fromkeys(arm.variant for arm in arms))
    rows: dict[tuple, dict[str, Arm]] = {}
    for arm in arms:
        settings = dataclasses.asdict(arm)
        key = repr([settings[name] for name in settings if name not in IGNORED])
        rows.setdefault(key, {})[arm.variant] = arm
    return variants, list(rows.values())


def run_timelines_chart(
    representative: pd.DataFrame, timelines: pd.DataFrame, arms: Sequence[Arm]
) -> dict:
    """Rows of arms that differ only in their variant, a column per variant."""
    variants, rows = rows_of_arms(arms)
    chosen = representative.set_index("arm")
    scales = shared_scales(timelines)
    lines = []
    for row in rows:
        cells = [
            arm_cell(row[variant], chosen.loc[row[variant].name], timelines, scales)
            if variant in row
            else note_cell(f"no {variant} arm with these settings")
            for variant in variants
        ]
        lines.append(alt.hconcat(*cells))
    chart = alt.vconcat(*lines).properties(title=FIGURE_TITLES["run_timelines"])
    return chart.to_dict()


def shared_scales(timelines: pd.DataFrame) -> dict[str, alt.Scale]:
    """One time axis for every cell, one value scale per panel from zero."""

    def top(values: pd.Series) -> float:
        return float(values.max()) if len(values) else 1.0

    scales = {"t_s": alt.Scale(domain=[0, top(timelines["t_s"])], nice=False)}
    for series in PANELS:
        values = timelines.loc[timelines["series"] == series, "value"]
        scales[series] = alt.Scale(domain=[0, top(values)])
    scales[THROTTLED] = alt.Scale(domain=[0, 1])
    return scales


def arm_cell(
    arm: Arm, chosen: pd.Series, timelines: pd.DataFrame, scales: dict
) -> alt.VConcatChart | alt.Chart:
    """The arm's three panels under a title that names the run and why."""
    title = f"{arm.name} ({arm.variant}): {chosen['chosen_because']}"
    if pd.isna(chosen["run"]):
        return note_cell(title)
    of_run = timelines[
        (timelines["arm"] == arm.name) & (timelines["run"] == chosen["run"])
    ]
    panels = []
    for series, heading in PANELS.items():
        points = of_run.loc[of_run["series"] == series, ["t_s", "value"]]
        if points.empty:
            why = "no CPU quota" if arm.cpu_quota is None else "none recorded"
            panels.append(note_cell(f"{heading}: {why}", HEIGHT))
            continue
        bottom = series == list(PANELS)[-1]
        panels.append(panel(points, series, heading, scales, bottom))
    return alt.vconcat(*panels, spacing=4).properties(title=title)


def panel(
    points: pd.DataFrame, series: str, heading: str, scales: dict, bottom: bool
) -> alt.Chart:
    """One series of one run; only the bottom panel names the time axis."""
    points = points.assign(
        t_s=points["t_s"].round(DECIMALS["t_s"]),
        value=points["value"].round(DECIMALS[series]),
    )
    time_title = "seconds into the measured window" if bottom else None
    x = alt.X("t_s:Q", scale=scales["t_s"], title=time_title)
    y = alt.Y("value:Q", scale=scales[series], title=heading)
    tooltip = [alt.Tooltip("t_s:Q", title="s"), alt.Tooltip("value:Q", title=heading)]
    chart = alt.Chart(points)
    mark = (
        chart.mark_circle(size=12, opacity=0.6)
        if series == TTFT
        else chart.mark_line(point=alt.OverlayMarkDef(size=10))
    )
    return mark.encode(x=x, y=y, tooltip=tooltip).properties(width=WIDTH, height=HEIGHT)


def note_cell(text: str, height: int = HEIGHT) -> alt.Chart:
    """A cell with a sentence where there is nothing to draw."""
    return (
        alt.Chart(pd.DataFrame({"text": [text]}))
        .mark_text(align="left", baseline="middle", x=0, y=height / 2)
        .encode(text="text:N")
        .properties(width=WIDTH, height=height)
    )
