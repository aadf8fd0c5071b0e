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
from serving_study.report.markup import escape, html_table
from serving_study.report.settings import ReportSettings


def is_release_series(
    settings: ReportSettings, tables: dict[str, pd.DataFrame]
) -> bool:
    return settings.release_series and RELEASE_TABLE in tables


def release_change_html(
    tables: dict[str, pd.DataFrame], settings: ReportSettings
) -> str:
    """Where each figure of a release series first changed, or nothing."""
    if not is_release_series(settings, tables):
        return ""
    releases = tables["releases"]
    items = "".join(
        f"<li>{escape(describe_first_change(releases, metric))}</li>"
        for metric in dict.fromkeys(releases["metric"])
    )
    return f'<h3>Release series</h3><ul class="verdicts">{items}</ul>'


def releases_html(tables: dict[str, pd.DataFrame], settings: ReportSettings) -> str:
    releases = tables["releases"]
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
    header = [
        "release",
        "figure",
        "valid runs",
        "median [min–max]",
        "against",
        "ratio",
        "verdict",
        "why",
        "within each block",
    ]
    rows = [
        [
            row["release"],
            f"{row['label']} ({row['unit']})",
            text(row["runs"]),
            summary_text({**row, "ci_low": math.nan}),
            text(row["compared_with"]),
            ratio_text(row["ratio"]),
            ("first change: " if row["first_change"] else "") + text(row["verdict"]),
            text(row["detail"]),
            text(row["block_ratios"]),
        ]
        for row in releases.to_dict("records")
    ]
    return f'<p class="note">{escape(note)}</p>' + html_table(header, rows)
