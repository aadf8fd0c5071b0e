"""Every figure of the report as a Vega-Lite spec, built with altair from the
aggregated tables. Charts are returned as dicts so that the report can embed
them and also keep them as `.vl.json` files.
"""

import pandas as pd

from serving_study.analysis.aggregate import MAP_CONTRAST_TABLE, MAP_TABLE
from serving_study.analysis.fix_comparison import FIXES_TABLE, fixes_chart_spec
from serving_study.analysis.run_timelines import REPRESENTATIVE_RUNS, RUN_TIMELINES
from serving_study.report.arm_charts import arm_comparison, throughput_vs_concurrency
from serving_study.report.map_chart import thread_quota_map
from serving_study.report.release_chart import release_series
from serving_study.report.releases import is_release_series
from serving_study.report.run_timeline_chart import run_timelines_chart
from serving_study.report.settings import ReportSettings


def chart_specs(
    tables: dict[str, pd.DataFrame], settings: ReportSettings
) -> dict[str, dict]:
    """Every figure as a Vega-Lite spec, keyed by figure name."""
    specs = {
        "throughput_vs_concurrency": throughput_vs_concurrency(tables, settings.arms),
        "arm_comparison": arm_comparison(tables, settings.arm_names),
    }
    if is_release_series(settings, tables):
        specs["release_series"] = release_series(tables)
    if MAP_TABLE in tables:
        specs["thread_quota_map"] = thread_quota_map(
            tables[MAP_TABLE], tables[MAP_CONTRAST_TABLE]
        )
    if FIXES_TABLE in tables:
        specs["which_fix"] = fixes_chart_spec(tables[FIXES_TABLE])
    if RUN_TIMELINES in tables:
        specs["run_timelines"] = run_timelines_chart(
            tables[REPRESENTATIVE_RUNS], tables[RUN_TIMELINES], settings.arms
        )
    return specs
