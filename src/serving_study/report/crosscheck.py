"""Our client against SGLang's bench_serving in the report: both clients side by
side with the throughput ratio and its verdict, then every run
(analysis/crosscheck_table.py builds both tables)."""

import pandas as pd

from serving_study.analysis.crosscheck_table import CLIENTS
from serving_study.analysis.numbers import format_number, is_number
from serving_study.report.formatting import text
from serving_study.report.markup import Table

HEADINGS = {"throughput_rps": "req/s", "ttft_p50_ms": "TTFT p50 (ms)"}
HEADINGS |= {"ttft_p99_ms": "TTFT p99 (ms)", "e2e_p50_ms": "end-to-end p50 (ms)"}
HEADINGS |= {"main_cpu_ms_per_request": "server main-process CPU per request (ms)"}
HEADINGS |= {"client_cpu_ms_per_request": "client CPU per request (ms)"}


def crosscheck_tables(summary: pd.DataFrame, runs: pd.DataFrame) -> list[Table]:
    return [summary_table(summary), runs_table(runs)]


def summary_table(summary: pd.DataFrame) -> Table:
    rows = []
    for row in summary.to_dict("records"):
        shown = {
            "arm": row["arm"],
            "pairs where both runs count": f"{row['valid_pairs']} of {row['pairs']}",
        }
        for name, heading in HEADINGS.items():
            for client in CLIENTS:
                shown[f"{client} {heading}"] = format_number(row[f"{client}_{name}"])
        shown |= {
            "req/s ratio, ours / bench_serving (median of pairs)": three_places(
                row["ratio"]
            ),
            "verdict": row["verdict"],
            "pairs' ratios": f"{three_places(row['ratio_min'])} to "
            f"{three_places(row['ratio_max'])}",
        }
        rows.append(shown)
    return Table(
        list(rows[0]) if rows else [],
        [list(row.values()) for row in rows],
        numeric_from=2,
        verdict_column=len(rows[0]) - 2 if rows else None,
        row_classes=[verdict_class(row["verdict"]) for row in rows],
        when_empty="No cross-check ran.",
    )


def three_places(ratio) -> str:
    """A ratio judged to 5%, to three decimal places."""
    return f"{ratio:.3f}" if is_number(ratio) else "–"


def verdict_class(verdict: str) -> str:
    """The verdict's colour, as the claims table gives it."""
    if verdict.startswith("within"):
        return "holds"
    return "does-not-hold" if verdict.startswith("not within") else "cannot-tell"


def runs_table(runs: pd.DataFrame) -> Table:
    columns = {
        "pair": "pair",
        "client": "client",
        "ran": "order",
        "counts": "counts",
        "req/s": "throughput_rps",
        "TTFT p50 (ms)": "ttft_p50_ms",
        "TTFT p99 (ms)": "ttft_p99_ms",
        "end-to-end p50 (ms)": "e2e_p50_ms",
        "server cores used": "cores_used",
        "server main-process CPU per request (ms)": "main_cpu_ms_per_request",
        "client CPU per request (ms)": "client_cpu_ms_per_request",
        "host's other load (cores)": "host_other_cores",
    }
    counts = [
        "yes" if valid else f"no: {text(reasons)}"
        for valid, reasons in zip(runs["valid"], runs["invalid_reasons"], strict=True)
    ]
    order = ["first" if order == 1 else "second" for order in runs["order"]]
    return Table.of_frame(
        runs.assign(counts=counts, order=order),
        columns,
        figures=tuple(list(columns.values())[4:]),
        numeric_from=4,
        folded="Every run of both clients",
    )
