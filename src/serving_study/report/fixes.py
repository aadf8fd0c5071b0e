"""The "which fix" table: each fix under the quota beside the trap, and its CPU
cost where nothing throttles (fix_comparison.py builds the figures)."""

import pandas as pd

from serving_study.analysis.numbers import format_number, is_number
from serving_study.report.formatting import ratio_text
from serving_study.report.markup import html_table


def fixes_html(fixes: pd.DataFrame) -> str:
    """The "which fix" table: each fix under the quota, and its CPU cost where
    nothing throttles (fix_comparison.py)."""
    header = [
        "fix",
        "arm",
        "req/s under quota",
        "vs trap",
        "TTFT p50 (ms)",
        "main CPU/request under quota (ms)",
        "event-loop thread CPU (%)",
        "other threads' CPU (%)",
        "arm without quota",
        "main CPU/request without quota (ms)",
        "verdicts",
    ]
    rows = [
        [
            row.fix,
            row.arm,
            format_number(row.throughput_rps),
            ratio_text(row.throughput_vs_trap),
            format_number(row.ttft_p50_ms),
            format_number(row.main_cpu_ms_per_request),
            format_number(row.main_thread_cpu_percent),
            format_number(row.other_threads_cpu_percent),
            row.without_quota_arm if isinstance(row.without_quota_arm, str) else "",
            (
                format_number(row.main_cpu_ms_per_request_without_quota)
                if is_number(row.main_cpu_ms_per_request_without_quota)
                else "not measured"
            ),
            row.verdicts if isinstance(row.verdicts, str) else "",
        ]
        for row in fixes.itertuples()
    ]
    return html_table(header, rows, numeric_from=2)
