"""A release series in words: where each figure first changed, and each release
against the one before it (release_change.py judges; this module writes)."""

import math

import pandas as pd

from serving_study.analysis.aggregate import RELEASE_TABLE
from serving_study.analysis.release_change import (
    describe_first_change,
    false_alarm_chance,
)
from serving_study.report.formatting import ratio_text, summary_text, text
from serving_study.report.markup import Table
from serving_study.report.settings import ReportSettings


def is_release_series(
    settings: ReportSettings, tables: dict[str, pd.DataFrame]
) -> bool:
    return settings.release_series and RELEASE_TABLE in tables


def first_changes(
    tables: dict[str, pd.DataFrame], settings: ReportSettings
) -> list[str]:
    """Where each figure of a release series first changed; none for no series."""
    if not is_release_series(settings, tables):
        return []
    releases = tables[RELEASE_TABLE]
    return [
        describe_first_change(releases, metric)
        for metric in dict.fromkeys(releases["metric"])
    ]


def releases_table(tables: dict[str, pd.DataFrame], settings: ReportSettings) -> Table:
    releases = tables[RELEASE_TABLE]
    criterion = settings.change_criterion
    runs = criterion.min_valid_runs
    note = (
        "A release differs from the one before it when their [min, max] ranges "
        "over valid runs do not overlap and the larger median is at least "
        f"{1 + criterion.min_change:.3g}x the smaller; each needs {runs} valid "
        f"runs. Two releases that perform alike still fall apart by chance in "
        f"{false_alarm_chance(runs, runs):.1%} of comparisons of {runs} runs each. "
        "The ratios within each repetition block are shown for reading: drift of "
        "the host between blocks cancels in them, but they do not enter the verdict."
    )
    rows = [
        {
            "release": row["release"],
            "figure": f"{row['label']} ({row['unit']})",
            "valid runs": row["runs"],
            "median [min–max]": summary_text({**row, "ci_low": math.nan}),
            "against": row["compared_with"],
            "ratio": ratio_text(row["ratio"]),
            "verdict": ("first change: " if row["first_change"] else "")
            + text(row["verdict"]),
            "why": row["detail"],
            "within each block": row["block_ratios"],
        }
        for row in releases.to_dict("records")
    ]
    return Table.of_rows(rows, notes=[note])
