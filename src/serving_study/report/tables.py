"""The measurement tables: arms beside the study's numbers, invalid runs, earlier
attempts, every run (flagged where its node differs from host.json), and every
cell of the thread x quota map."""

import pandas as pd

from serving_study.analysis.attempts import ATTEMPTS_TABLE
from serving_study.analysis.numbers import format_number
from serving_study.analysis.summaries import NODE_FLAG
from serving_study.measure.run_metrics import METRICS
from serving_study.report.formatting import (
    interval_text,
    metric_heading,
    summary_text,
    text,
)
from serving_study.report.markup import escape, html_table

# Arm-table columns, in order; the study's number follows each one it has.
SUMMARY_METRICS = (
    "throughput_rps",
    "ttft_p50_ms",
    "e2e_p50_ms",
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


def arms_html(tables: dict[str, pd.DataFrame]) -> str:
    arms = tables["arms"]
    shown = [
        metric
        for metric in SUMMARY_METRICS
        if arms.loc[arms["metric"] == metric, ["median", "reference"]]
        .notna()
        .any()
        .any()
    ]
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
    notes = sorted(
        set(arms.loc[arms["metric"] == "throughput_rps", "ci_note"].dropna())
    )
    note_html = "".join(f'<p class="note">{escape(note)}</p>' for note in notes)
    details = html_table(
        [
            "arm",
            "figure",
            "unit",
            "runs with it",
            "median",
            "min",
            "max",
            "95% CI",
            "study",
        ],
        [
            [
                row["arm"],
                row["label"],
                row["unit"],
                text(row["n_values"]),
                format_number(row["median"]),
                format_number(row["min"]),
                format_number(row["max"]),
                interval_text(row),
                format_number(row["reference"]),
            ]
            for row in arms.to_dict("records")
        ],
        numeric_from=3,
    )
    return (
        '<p class="note">Cells: median [min–max] over valid runs.</p>'
        + html_table(header, rows, numeric_from=2)
        + note_html
        + f"<details><summary>Every figure of every arm</summary>{details}</details>"
    )


def invalid_runs_html(tables: dict[str, pd.DataFrame]) -> str:
    invalid = tables["invalid_runs"]
    if invalid.empty:
        return "<p>None: every run counts.</p>"
    rows = [
        [row["arm"], text(row["run"]), text(row["reasons"])]
        for row in invalid.to_dict("records")
    ]
    return html_table(["arm", "run", "reasons"], rows)


def attempts_html(tables: dict[str, pd.DataFrame]) -> str:
    attempts = tables[ATTEMPTS_TABLE]
    if attempts.empty:
        return "<p>None: every run was measured once.</p>"
    rows = [
        [
            row["arm"],
            text(row["run"]),
            text(row["attempt"]),
            text(row["outcome"]),
            "yes" if row["valid"] else "no",
            format_number(row["throughput_rps"]),
            text(row["reasons"]),
        ]
        for row in attempts.to_dict("records")
    ]
    header = ["arm", "run", "attempt", "outcome", "valid"]
    header += [metric_heading("throughput_rps"), "reasons"]
    note = (
        "Kept on disk under results/<experiment>/attempts/; each run's current "
        "attempt is the one in the table of every run."
    )
    return f'<p class="note">{escape(note)}</p>' + html_table(header, rows)


def runs_html(tables: dict[str, pd.DataFrame]) -> str:
    runs = tables["runs"]
    flags = [text(flag) for flag in runs.get(NODE_FLAG, pd.Series(dtype=str))]
    flagged = any(flags)
    header = ["arm", "run", "valid"] + [
        metric_heading(c) if c in METRICS else c.replace("_", " ") for c in RUN_COLUMNS
    ]
    rows = [
        [row["arm"], text(row["run"]), "yes" if row["valid"] else "no"]
        + [format_number(row[column]) for column in RUN_COLUMNS]
        for row in runs.to_dict("records")
    ]
    if not flagged:
        return html_table(header, rows, numeric_from=3)
    # Where a run's node differs from host.json: a flag, not a reason to drop it.
    header.insert(3, "node differs from host.json in")
    for row, flag in zip(rows, flags, strict=True):
        row.insert(3, flag.replace(",", ", "))
    note = (
        'A run flagged in "node differs from host.json in" ran on another node '
        "than the one host.json describes (SLURM may place each run on its own "
        "node); it still counts."
    )
    return f'<p class="note">{escape(note)}</p>' + html_table(
        header, rows, numeric_from=4
    )


def map_cells_html(cells: pd.DataFrame) -> str:
    # The cell figures the table holds, without those no cell measured (GPU).
    columns = [c for c in cells.columns if c in METRICS and cells[c].notna().any()]
    header = [
        "block",
        "order",
        "variant",
        "intra-op threads",
        "quota (cores)",
        "valid",
    ] + [metric_heading(column) for column in columns]
    header.append("why invalid")
    rows = [
        [
            text(row["block"]),
            text(row["position"]),
            row["variant"],
            text(row["intra_op_threads"]),
            text(row["cpu_quota"]),
            "yes" if row["valid"] else "no",
            *(format_number(row[column]) for column in columns),
            text(row["invalid_reason"]),
        ]
        for row in cells.to_dict("records")
    ]
    return html_table(header, rows, numeric_from=6)


def map_by_quota_html(by_quota: pd.DataFrame) -> str:
    header = [
        "quota (cores)",
        "baseline",
        "compared",
        "thread counts",
        "smallest ratio",
        "largest ratio",
        "threads at the largest",
        "paired blocks",
        "blocks below 1",
        "blocks above 1",
    ]
    rows = [
        [
            text(row["cpu_quota"]),
            row["baseline"],
            row["compared"],
            text(row["thread_counts"]),
            format_number(row["ratio_min"]),
            format_number(row["ratio_max"]),
            text(row["threads_at_max"]),
            text(row["paired_blocks"]),
            text(row["blocks_below_1"]),
            text(row["blocks_above_1"]),
        ]
        for row in by_quota.to_dict("records")
    ]
    return html_table(header, rows, numeric_from=3)


def map_contrast_html(contrast: pd.DataFrame) -> str:
    header = [
        "intra-op threads",
        "quota (cores)",
        "baseline",
        "compared",
        "baseline req/s",
        "compared req/s",
        "ratio (median of blocks)",
        "paired blocks",
        "blocks below 1",
        "blocks above 1",
        "each block's ratio",
    ]
    rows = [
        [
            text(row["intra_op_threads"]),
            text(row["cpu_quota"]),
            row["baseline"],
            row["compared"],
            format_number(row["baseline_rps"]),
            format_number(row["compared_rps"]),
            format_number(row["ratio"]),
            text(row["paired_blocks"]),
            text(row["blocks_below_1"]),
            text(row["blocks_above_1"]),
            text(row["block_ratios"]).replace(";", ", "),
        ]
        for row in contrast.to_dict("records")
    ]
    return html_table(header, rows, numeric_from=4)
