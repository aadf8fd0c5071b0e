"""The "which fix" table: each fix under the quota beside the trap, and its CPU
cost where nothing throttles (fix_comparison.py builds the figures)."""

import pandas as pd

from serving_study.analysis.numbers import format_number, is_number
from serving_study.report.formatting import ratio_text
from serving_study.report.markup import Table


def fixes_table(fixes: pd.DataFrame) -> Table:
    columns = {
        "fix": "fix",
        "arm": "arm",
        "req/s under quota": "throughput_rps",
        "vs trap": "vs_trap",
        "TTFT p50 (ms)": "ttft_p50_ms",
        "main CPU/request under quota (ms)": "main_cpu_ms_per_request",
        "event-loop thread CPU (%)": "main_thread_cpu_percent",
        "other threads' CPU (%)": "other_threads_cpu_percent",
        "arm without quota": "without_quota_arm",
        "main CPU/request without quota (ms)": "without_quota",
        "verdicts": "verdicts",
    }
    without_quota = [
        format_number(value) if is_number(value) else "not measured"
        for value in fixes["main_cpu_ms_per_request_without_quota"]
    ]
    figures = ["throughput_rps", "ttft_p50_ms", "main_cpu_ms_per_request"]
    figures += ["main_thread_cpu_percent", "other_threads_cpu_percent"]
    return Table.of_frame(
        fixes.assign(
            vs_trap=[ratio_text(ratio) for ratio in fixes["throughput_vs_trap"]],
            without_quota=without_quota,
        ),
        columns,
        figures=figures,
        numeric_from=2,
    )
