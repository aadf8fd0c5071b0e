"""The claims: one sentence per claim at the top of the page, colored by its
verdict, and the tables of ratios and verdicts behind them; each verdict says
whether it tests its bound or confirms it, and where the bound came from."""

import pandas as pd

from serving_study.analysis.claims import CANNOT_TELL, DOES_NOT_HOLD, HOLDS
from serving_study.analysis.numbers import format_number
from serving_study.metric_catalogue import METRICS
from serving_study.report.formatting import ratio_text, text
from serving_study.report.markup import Table


def verdict_sentences(tables: dict[str, pd.DataFrame]) -> list[tuple[str, str]]:
    """Each claim's sentence, with the class that colors it by its verdict."""
    return [
        (verdict_class(claim["verdict"]), claim["sentence"])
        for claim in tables["claims"].to_dict("records")
    ]


def verdict_class(verdict: str) -> str:
    return {
        HOLDS: "holds",
        DOES_NOT_HOLD: "does-not-hold",
        CANNOT_TELL: "cannot-tell",
    }.get(verdict, "")


def ratios_table(tables: dict[str, pd.DataFrame]) -> Table:
    rows = [
        {
            "claim": row["claim"],
            "figure": METRICS[row["metric"]].label,
            "numerator": row["numerator"],
            "denominator": row["denominator"],
            "medians": f"{format_number(row['numerator_median'])} / "
            f"{format_number(row['denominator_median'])}",
            "ratio of medians": ratio_text(row["ratio_of_medians"]),
            "study": ratio_text(row["reference_ratio"]),
            "per block": text(row["block_ratios"]) or "no paired blocks",
        }
        for row in tables["ratios"].to_dict("records")
    ]
    return Table.of_rows(rows, when_empty="No ratio claims.")


def claims_table(tables: dict[str, pd.DataFrame]) -> Table:
    columns = ["claim", "statement", "arms", "bound", "verdict"]
    columns += ["judged_as", "bound_from", "detail"]
    records = tables["claims"].to_dict("records")
    return Table(
        ["claim", "statement", "arms", "needs", "verdict"]
        + ["test or confirmation", "bound from", "numbers"],
        [[row[column] for column in columns] for row in records],
        verdict_column=4,
        row_classes=[verdict_class(row["verdict"]) for row in records],
        when_empty="The config states no claims.",
    )
