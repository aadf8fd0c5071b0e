"""The thread x quota map's figure: each variant's median throughput over the
blocks as one heatmap (intra-op threads across, quota down), and with two
variants their ratio, the median of the ratios paired within blocks."""

import altair as alt
import pandas as pd

from serving_study.analysis.map_contrast import cell_medians, quota_order
from serving_study.report.figures import FIGURE_TITLES


def thread_quota_map(cells: pd.DataFrame, contrast: pd.DataFrame) -> dict:
    """One throughput heatmap per variant; with two variants, also their ratio."""
    variants = list(dict.fromkeys(cells["variant"]))
    if len(contrast):
        named = [contrast["baseline"].iloc[0], *dict.fromkeys(contrast["compared"])]
        variants = named + [v for v in variants if v not in named]
    cells = cell_medians(cells.assign(cpu_quota=cells["cpu_quota"].astype(str)))
    threads = sorted(int(t) for t in cells["intra_op_threads"].unique())
    quotas = quota_order(cells["cpu_quota"])
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
    if len(variants) == 2 and len(contrast):
        first, second = variants
        paired = contrast.assign(cpu_quota=contrast["cpu_quota"].astype(str))
        panels.append(
            heatmap_panel(
                paired.dropna(subset=["ratio"]),
                x,
                y,
                "ratio",
                alt.Scale(scheme="blueorange", domainMid=1, type="log"),
                f"{second} / {first} throughput (paired in blocks)",
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
