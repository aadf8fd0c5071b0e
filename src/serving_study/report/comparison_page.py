"""The page of two results folders side by side (analysis/comparison.py builds its
tables): the folders and how their hosts differ, each arm's figures in both with
their intervals, and each claim's value and verdict in both, as tables and as
figures (templates/compare.html.j2)."""

import altair as alt
import pandas as pd

from serving_study.analysis.comparison import SIDES
from serving_study.analysis.release_change import ChangeCriterion
from serving_study.analysis.repeatability_text import cell
from serving_study.report.document import render_page
from serving_study.report.formatting import ratio_text, summary_text
from serving_study.report.markup import Table

# Each folder's columns of the arms table that the figure draws.
FIGURE_KEYS = ("median", "min", "max", "ci_low", "ci_high")
FIGURE_TITLES = {
    "compare_arms": "Each arm in both folders",
    "compare_claims": "Each ratio claim in both folders",
}
FIGURE_CAPTIONS = {
    "compare_arms": (
        "Per arm and figure, each folder's median over its valid runs (dot), its "
        "[min, max] (thin rule) and, from 5 valid runs on, the bootstrap 95% "
        "interval of the median (thick rule)."
    ),
    "compare_claims": (
        "Per ratio claim, each folder's ratio of medians (dot) and the range of "
        "the same ratio within its run blocks (rule). Claims that arms lie within "
        "a spread are in the table only."
    ),
}


def comparison_page(tables: dict[str, pd.DataFrame], criterion: ChangeCriterion) -> str:
    folders = tables["folders"]
    labels = list(folders["label"])
    specs = {
        "compare_arms": arms_chart(tables["arms"], labels),
        "compare_claims": claims_chart(tables["claims"], labels),
    }
    return render_page(
        "compare.html.j2",
        f"{labels[0]} and {labels[1]} side by side",
        with_charts=True,
        labels=labels,
        folders=folders_table(folders),
        hosts=hosts_table(tables["hosts"], labels),
        arms=arms_table(tables["arms"], labels),
        claims=claims_table(tables["claims"], labels),
        criterion=criterion,
        figures=specs,
        figure_titles=FIGURE_TITLES,
        figure_captions=FIGURE_CAPTIONS,
    )


def folders_table(folders: pd.DataFrame) -> Table:
    return Table.of_frame(
        folders.assign(
            counted=[
                f"{row.valid_runs} valid of {row.runs} in {row.arms} arms"
                for row in folders.itertuples()
            ]
        ),
        {"folder": "label", "path": "path", "host": "host", "runs": "counted"},
    )


def hosts_table(hosts: pd.DataFrame, labels: list[str]) -> Table:
    return Table.of_frame(
        hosts,
        {"host.json key": "key", labels[0]: "first", labels[1]: "second"},
        when_empty="The two host.json files agree on every key.",
    )


def side_text(row: dict, side: str) -> str:
    """ "14.6 [14.1–15.3] (3 runs)", with the 95% interval where there is one."""
    figures = {key: row[f"{side}_{key}"] for key in ("median", "min", "max")}
    figures |= {key: row[f"{side}_{key}"] for key in ("ci_low", "ci_high")}
    if not row[f"{side}_runs"]:
        return "–"
    return f"{summary_text(figures)} ({row[f'{side}_runs']} runs)"


def arms_table(arms: pd.DataFrame, labels: list[str]) -> Table:
    rows = [
        {
            "arm": row["arm"],
            "figure": f"{row['label']} ({row['unit']})",
            labels[0]: side_text(row, "first"),
            labels[1]: side_text(row, "second"),
            f"{labels[1]} / {labels[0]}": ratio_text(row["ratio"]),
            "beyond the run-to-run spread": row["verdict"],
            "why": row["detail"],
            "arm's settings": row["settings"],
        }
        for row in arms.to_dict("records")
    ]
    return Table.of_rows(rows, numeric_from=2)


def claims_table(claims: pd.DataFrame, labels: list[str]) -> Table:
    rows = []
    for claim, group in claims.groupby("claim", sort=False):
        by_folder = {row.folder: row for row in group.itertuples()}
        first = group.iloc[0]
        rows.append(
            {
                "claim": f"{claim} ({first['ratio']})",
                "bound": " / ".join(dict.fromkeys(group["bound"])),
                **{
                    label: cell(by_folder[label]) if label in by_folder else "–"
                    for label in labels
                },
                "between the folders": first["between"],
            }
        )
    return Table.of_rows(rows)


def arms_chart(arms: pd.DataFrame, labels: list[str]) -> dict:
    """One panel per figure: each arm's median, [min, max] and interval per folder."""
    long = pd.concat(
        [
            arms[["arm", "metric", "label", "unit"]].assign(
                folder=label,
                **{key: arms[f"{side}_{key}"] for key in FIGURE_KEYS},
            )
            for side, label in zip(SIDES, labels, strict=True)
        ]
    ).dropna(subset=["median"])
    order = list(dict.fromkeys(arms["arm"]))
    panels = [
        arm_panel(long[long["metric"] == metric], order, labels)
        for metric in dict.fromkeys(long["metric"])
    ]
    rows = [
        alt.hconcat(*panels[start : start + 2]) for start in range(0, len(panels), 2)
    ]
    return alt.vconcat(*rows).properties(title=FIGURE_TITLES["compare_arms"]).to_dict()


def arm_panel(data: pd.DataFrame, order: list[str], labels: list[str]):
    first = data.iloc[0]
    x = alt.X("arm:N", sort=order, title=None, axis=alt.Axis(labelAngle=-30))
    offset = alt.XOffset("folder:N", scale=alt.Scale(domain=labels))
    color = alt.Color("folder:N", scale=alt.Scale(domain=labels), title="folder")
    base = alt.Chart(data[["arm", "folder", *FIGURE_KEYS]]).encode(
        x=x, xOffset=offset, color=color
    )
    heading = f"{first['label']} ({first['unit']})"
    layers = [
        base.mark_rule().encode(y=alt.Y("min:Q", title=heading), y2="max:Q"),
        base.transform_filter("isValid(datum.ci_low)")
        .mark_rule(strokeWidth=4, opacity=0.5)
        .encode(y="ci_low:Q", y2="ci_high:Q"),
        base.mark_circle(size=50, opacity=1).encode(
            y="median:Q",
            tooltip=["arm", "folder"]
            + [alt.Tooltip(f"{key}:Q", format=".4g") for key in FIGURE_KEYS],
        ),
    ]
    width = max(200, 45 * len(order))
    return alt.layer(*layers).properties(width=width, height=180, title=heading)


def claims_chart(claims: pd.DataFrame, labels: list[str]) -> dict:
    ratios = claims[~claims["ratio"].str.endswith(" within")]
    ratios = ratios.assign(name=ratios["claim"] + " (" + ratios["ratio"] + ")")
    data = ratios[["name", "folder", "value", "block_min", "block_max", "verdict"]]
    y = alt.Y(
        "name:N",
        sort=list(dict.fromkeys(data["name"])),
        title=None,
        axis=alt.Axis(labelLimit=400),
    )
    offset = alt.YOffset("folder:N", scale=alt.Scale(domain=labels))
    color = alt.Color("folder:N", scale=alt.Scale(domain=labels), title="folder")
    base = alt.Chart(data).encode(y=y, yOffset=offset, color=color)
    chart = alt.layer(
        base.transform_filter("isValid(datum.block_min)")
        .mark_rule()
        .encode(x="block_min:Q", x2="block_max:Q"),
        base.mark_circle(size=50, opacity=1).encode(
            x=alt.X(
                "value:Q",
                scale=alt.Scale(type="log"),
                title="ratio of medians (x, log scale)",
            ),
            tooltip=["name", "folder", "verdict", alt.Tooltip("value:Q", format=".3f")],
        ),
    )
    return chart.properties(
        width=420, height=alt.Step(14), title=FIGURE_TITLES["compare_claims"]
    ).to_dict()
