"""The claims: one sentence per claim at the top of the page, colored by its
verdict, and the tables of ratios and verdicts behind them."""

import pandas as pd

from serving_study.analysis.claims import CANNOT_TELL, DOES_NOT_HOLD, HOLDS
from serving_study.analysis.numbers import format_number
from serving_study.measure.run_metrics import METRICS
from serving_study.report.formatting import ratio_text, text
from serving_study.report.markup import escape, html_table


def verdicts_html(tables: dict[str, pd.DataFrame]) -> str:
    items = []
    for claim in tables["claims"].to_dict("records"):
        css = verdict_class(claim["verdict"])
        items.append(f'<li class="{css}">{escape(claim["sentence"])}.</li>')
    if not items:
        items.append("<li>The config states no claims.</li>")
    runs = tables["runs"]
    invalid = int((~runs["valid"].astype(bool)).sum())
    if invalid:
        were = "was" if invalid == 1 else "were"
        note = (
            f"{invalid} of {len(runs)} runs {were} invalid and left out of every "
            "median (see the invalid runs below)."
        )
    else:
        note = f"All {len(runs)} runs were valid."
    return f'<ul class="verdicts">{"".join(items)}</ul>\n<p class="note">{note}</p>'


def verdict_class(verdict: str) -> str:
    return {
        HOLDS: "holds",
        DOES_NOT_HOLD: "does-not-hold",
        CANNOT_TELL: "cannot-tell",
    }.get(verdict, "")


def ratios_html(tables: dict[str, pd.DataFrame]) -> str:
    ratios = tables["ratios"]
    if ratios.empty:
        return "<p>No ratio claims.</p>"
    header = [
        "claim",
        "figure",
        "numerator",
        "denominator",
        "medians",
        "ratio of medians",
        "study",
        "per block",
    ]
    rows = [
        [
            row["claim"],
            METRICS[row["metric"]].label,
            row["numerator"],
            row["denominator"],
            f"{format_number(row['numerator_median'])} / "
            f"{format_number(row['denominator_median'])}",
            ratio_text(row["ratio_of_medians"]),
            ratio_text(row["reference_ratio"]),
            text(row["block_ratios"]) or "no paired blocks",
        ]
        for row in ratios.to_dict("records")
    ]
    return html_table(header, rows)


def claims_html(tables: dict[str, pd.DataFrame]) -> str:
    claims = tables["claims"]
    if claims.empty:
        return "<p>The config states no claims.</p>"
    header = ["claim", "statement", "arms", "needs", "verdict", "numbers"]
    records = claims.to_dict("records")
    rows = [
        [
            row["claim"],
            row["statement"],
            row["arms"],
            row["bound"],
            row["verdict"],
            row["detail"],
        ]
        for row in records
    ]
    row_classes = [verdict_class(row["verdict"]) for row in records]
    return html_table(header, rows, row_classes=row_classes, verdict_column=4)
