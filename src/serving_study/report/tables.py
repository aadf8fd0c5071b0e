"""The measurement tables: arms beside the study's numbers, invalid runs, earlier
attempts, every run (flagged where its node differs from host.json), and every
cell of the thread x quota map."""

import pandas as pd

from serving_study.analysis.attempts import ATTEMPTS_TABLE
from serving_study.analysis.map_contrast import BLOCK_COUNTS
from serving_study.analysis.numbers import format_number
from serving_study.analysis.summaries import NODE_FLAG
from serving_study.metric_catalogue import METRICS
from serving_study.report.formatting import (
    interval_text,
    metric_heading,
    summary_text,
    text,
)
from serving_study.report.markup import Table

# Arm-table columns, in order; the study's number follows each one it has.
SUMMARY_METRICS = (
    "throughput_rps",
    "ttft_p50_ms",
    "e2e_p50_ms",
    "tpot_p50_ms",
    "itl_p50_ms",
    "main_cpu_percent",
    "scheduler_cpu_percent",
    "cores_used",
    "throttled_share",
    "gpu_util_percent",
    "gpu_memory_used_mib",
)

RUN_COLUMNS = (
    "throughput_rps",
    "output_tokens_per_s",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "e2e_p50_ms",
    "tpot_p50_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "main_cpu_percent",
    "scheduler_cpu_percent",
    "cores_used",
    "throttled_share",
    "gpu_util_percent",
    "gpu_memory_used_mib",
    "torch_threads",
    "main_threads_max",
    "dispatch_lag_max_ms",
    "host_steal_cores",
    "error_count",
)

# The map's counts of paired blocks, as its tables head them.
BLOCK_HEADINGS = {count.replace("_", " "): count for count in BLOCK_COUNTS}


def arms_tables(tables: dict[str, pd.DataFrame]) -> list[Table]:
    """The arms beside the study's numbers, and folded under it every figure."""
    arms = tables["arms"]
    shown = metrics_with_numbers(arms, SUMMARY_METRICS)
    with_reference = {
        metric
        for metric in shown
        if arms.loc[arms["metric"] == metric, "reference"].notna().any()
    }
    header = ["arm", "valid runs"]
    for metric in shown:
        header.append(metric_heading(metric))
        if metric in with_reference:
            header.append("study")
    rows = []
    for arm, group in arms.groupby("arm", sort=False):
        by_metric = group.set_index("metric")
        first = group.iloc[0]
        row = [arm, f"{int(first['n_valid'])} of {int(first['n_total'])}"]
        for metric in shown:
            summary = by_metric.loc[metric]
            row.append(summary_text(summary))
            if metric in with_reference:
                row.append(format_number(summary["reference"]))
        rows.append(row)
    medians = Table(
        header, rows, numeric_from=2, notes=["Cells: median [min–max] over valid runs."]
    )
    intervals = [interval_text(row) for row in arms.to_dict("records")]
    columns = {
        "arm": "arm",
        "figure": "label",
        "unit": "unit",
        "runs with it": "n_values",
        "median": "median",
        "min": "min",
        "max": "max",
        "95% CI": "interval",
        "study": "reference",
    }
    ci_notes = arms.loc[arms["metric"] == "throughput_rps", "ci_note"].dropna()
    folded = Table.of_frame(
        arms.assign(interval=intervals),
        columns,
        figures=("median", "min", "max", "reference"),
        numeric_from=3,
        notes=sorted(set(ci_notes)),
        folded="Every figure of every arm",
    )
    return [medians, folded]


def metrics_with_numbers(arms: pd.DataFrame, metrics) -> list[str]:
    """Those of `metrics` that an arm measured or the study gives a number for."""
    numbers = arms[["median", "reference"]].notna().any(axis=1)
    return [metric for metric in metrics if numbers[arms["metric"] == metric].any()]


def yes_no(values) -> list[str]:
    return ["yes" if value else "no" for value in values]


def invalid_runs_table(tables: dict[str, pd.DataFrame]) -> Table:
    columns = {"arm": "arm", "run": "run", "reasons": "reasons"}
    when_empty = "None: every run counts."
    return Table.of_frame(tables["invalid_runs"], columns, when_empty=when_empty)


def attempts_table(tables: dict[str, pd.DataFrame]) -> Table:
    attempts = tables[ATTEMPTS_TABLE]
    columns = {
        "arm": "arm",
        "run": "run",
        "attempt": "attempt",
        "outcome": "outcome",
        "valid": "valid",
        metric_heading("throughput_rps"): "throughput_rps",
        "reasons": "reasons",
    }
    note = (
        "Kept on disk under results/<experiment>/attempts/; each run's current "
        "attempt is the one in the table of every run."
    )
    return Table.of_frame(
        attempts.assign(valid=yes_no(attempts["valid"])),
        columns,
        figures=("throughput_rps",),
        notes=[note],
        when_empty="None: every run was measured once.",
    )


def runs_table(tables: dict[str, pd.DataFrame]) -> Table:
    runs = tables["runs"]
    runs = runs.assign(valid=yes_no(runs["valid"]))
    flags = [text(flag) for flag in runs.get(NODE_FLAG, pd.Series(dtype=str))]
    columns = {"arm": "arm", "run": "run", "valid": "valid", "attempts": "attempts"}
    columns["retried because"] = "retried_because"
    notes = []
    # Where a run's node differs from host.json: a flag, not a reason to drop it.
    if any(flags):
        columns["node differs from host.json in"] = NODE_FLAG
        runs = runs.assign(**{NODE_FLAG: [flag.replace(",", ", ") for flag in flags]})
        notes.append(
            'A run flagged in "node differs from host.json in" ran on another node '
            "than the one host.json describes (SLURM may place each run on its own "
            "node); it still counts."
        )
    numeric_from = len(columns)
    for column in RUN_COLUMNS:
        heading = column.replace("_", " ")
        columns[metric_heading(column) if column in METRICS else heading] = column
    return Table.of_frame(
        runs, columns, figures=RUN_COLUMNS, numeric_from=numeric_from, notes=notes
    )


def map_cells_table(cells: pd.DataFrame) -> Table:
    # The cell figures the table holds, without those no cell measured (GPU).
    figures = [c for c in cells.columns if c in METRICS and cells[c].notna().any()]
    columns = {
        "block": "block",
        "order": "position",
        "variant": "variant",
        "intra-op threads": "intra_op_threads",
        "quota (cores)": "cpu_quota",
        "valid": "valid",
        **{metric_heading(figure): figure for figure in figures},
        "why invalid": "invalid_reason",
    }
    cells = cells.assign(valid=yes_no(cells["valid"]))
    return Table.of_frame(cells, columns, figures=figures, numeric_from=6)


def map_by_quota_table(by_quota: pd.DataFrame) -> Table:
    columns = {
        "quota (cores)": "cpu_quota",
        "baseline": "baseline",
        "compared": "compared",
        "thread counts": "thread_counts",
        "smallest ratio": "ratio_min",
        "largest ratio": "ratio_max",
        "threads at the largest": "threads_at_max",
        **BLOCK_HEADINGS,
    }
    figures = ("ratio_min", "ratio_max")
    return Table.of_frame(by_quota, columns, figures=figures, numeric_from=3)


def map_contrast_table(contrast: pd.DataFrame) -> Table:
    columns = {
        "intra-op threads": "intra_op_threads",
        "quota (cores)": "cpu_quota",
        "baseline": "baseline",
        "compared": "compared",
        "baseline req/s": "baseline_rps",
        "compared req/s": "compared_rps",
        "ratio (median of blocks)": "ratio",
        **BLOCK_HEADINGS,
        "each block's ratio": "block_ratios",
    }
    ratios = [text(ratios).replace(";", ", ") for ratios in contrast["block_ratios"]]
    return Table.of_frame(
        contrast.assign(block_ratios=ratios),
        columns,
        figures=("baseline_rps", "compared_rps", "ratio"),
        numeric_from=4,
    )
