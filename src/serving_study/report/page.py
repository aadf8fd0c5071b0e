"""One self-contained HTML page that states what this experiment found.

The page (templates/report.html.j2) opens with a plain sentence per claim and,
for a release series, where each figure first changed; then the setup, the
figures and the tables. Every string from a config, a host description or a log
is escaped (markup.py); the page loads nothing from the network (document.py).

With a figures directory, each figure is also written as its own page and as
its Vega-Lite spec (`<name>.html`, `<name>.vl.json`), and each table as its
own page (`table_<name>.html`), for Snakemake's `report()`.
"""

import json
from pathlib import Path

import pandas as pd

from serving_study.analysis.aggregate import (
    MAP_BY_QUOTA_TABLE,
    MAP_CONTRAST_TABLE,
    MAP_TABLE,
)
from serving_study.analysis.attempts import ATTEMPTS_TABLE
from serving_study.analysis.crosscheck_table import RUNS_TABLE as CROSSCHECK_RUNS_TABLE
from serving_study.analysis.crosscheck_table import SUMMARY_TABLE as CROSSCHECK_TABLE
from serving_study.analysis.fix_comparison import FIXES_TABLE
from serving_study.analysis.summaries import BOOTSTRAP_RESAMPLES, MIN_RUNS_FOR_INTERVAL
from serving_study.report.charts import chart_specs
from serving_study.report.crosscheck import crosscheck_tables
from serving_study.report.document import render_page
from serving_study.report.figures import FIGURE_CAPTIONS, FIGURE_TITLES, shown_figures
from serving_study.report.fixes import fixes_table
from serving_study.report.markup import Table
from serving_study.report.releases import (
    first_changes,
    is_release_series,
    releases_table,
)
from serving_study.report.settings import ReportSettings
from serving_study.report.study_setup import platform_html, setup_tables, variants_table
from serving_study.report.tables import (
    arms_tables,
    attempts_table,
    invalid_runs_table,
    map_by_quota_table,
    map_cells_table,
    map_contrast_table,
    runs_table,
)
from serving_study.report.verdicts import claims_table, ratios_table, verdict_sentences

TABLE_TITLES = {
    "arms": "Arms: medians over valid runs, with the study's numbers",
    "ratios": "Ratios of arm medians",
    "claims": "Claims and verdicts",
    "invalid_runs": "Invalid runs, left out of every median",
    ATTEMPTS_TABLE: "Earlier attempts (superseded or failed; never in a median)",
    "runs": "Every run",
    "releases": "Releases: each against the release before",
    MAP_BY_QUOTA_TABLE: "Thread x quota map: the variants compared per quota",
    MAP_CONTRAST_TABLE: "Thread x quota map: the variants compared, paired in blocks",
    MAP_TABLE: "Thread x quota map: every cell of every block",
    FIXES_TABLE: "Which fix: throughput, latency and CPU cost of each",
    CROSSCHECK_TABLE: "Our client against SGLang's bench_serving, on the same server",
}


def build_report(
    tables: dict[str, pd.DataFrame],
    settings: ReportSettings,
    host: dict,
    variants: list[dict],
    out_html: Path,
    figures_dir: Path | None = None,
) -> list[Path]:
    """Write the report page (and, with figures_dir, the per-item pages); return
    every file written."""
    specs = chart_specs(tables, settings)
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    shown = shown_figures(specs, settings.arms)
    page = render_report(tables, settings, host, variants, shown)
    out_html.write_text(page, encoding="utf-8")
    written = [out_html]
    if figures_dir is not None:
        written += write_report_items(tables, settings, specs, Path(figures_dir))
    return written


def write_report_items(
    tables: dict[str, pd.DataFrame],
    settings: ReportSettings,
    specs: dict,
    figures_dir: Path,
) -> list[Path]:
    """Each figure as a page and a `.vl.json`, each table as a page."""
    figures_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def write(file_name: str, text: str) -> None:
        path = figures_dir / file_name
        path.write_text(text, encoding="utf-8")
        written.append(path)

    for name, spec in specs.items():
        write(f"{name}.vl.json", json.dumps(spec, indent=1, allow_nan=False))
        page = render_page(
            "figure_page.html.j2",
            FIGURE_TITLES[name],
            with_charts=True,
            name=name,
            spec=spec,
            caption=FIGURE_CAPTIONS[name],
        )
        write(f"{name}.html", page)
    for name, section in table_sections(tables, settings).items():
        page = render_page(
            "table_page.html.j2", TABLE_TITLES[name], with_charts=False, section=section
        )
        write(f"table_{name}.html", page)
    return written


def render_report(
    tables: dict[str, pd.DataFrame],
    settings: ReportSettings,
    host: dict,
    variants: list[dict],
    specs: dict[str, dict],
) -> str:
    """The whole report page as a string."""
    runs = tables["runs"]
    sections = table_sections(tables, settings)
    # Earlier attempts: always a page of their own, a section only when there are any.
    if tables[ATTEMPTS_TABLE].empty:
        del sections[ATTEMPTS_TABLE]
    return render_page(
        "report.html.j2",
        f"{settings.experiment}: serving study report",
        with_charts=bool(specs),
        experiment=settings.experiment,
        description=settings.description,
        verdicts=verdict_sentences(tables),
        runs=len(runs),
        invalid_runs=int((~runs["valid"].astype(bool)).sum()),
        first_changes=first_changes(tables, settings),
        setup=setup_tables(tables, settings, host),
        platform=platform_html(settings),
        variants=variants_table(variants),
        figures=specs,
        figure_titles=FIGURE_TITLES,
        figure_captions=FIGURE_CAPTIONS,
        sections=sections,
        table_titles=TABLE_TITLES,
        bootstrap_resamples=BOOTSTRAP_RESAMPLES,
        min_runs_for_interval=MIN_RUNS_FOR_INTERVAL,
    )


def table_sections(
    tables: dict[str, pd.DataFrame], settings: ReportSettings
) -> dict[str, list[Table]]:
    """Each table section as the tables it shows, keyed by table name, in the
    page's order."""
    sections = {
        "arms": arms_tables(tables),
        "ratios": [ratios_table(tables)],
        "claims": [claims_table(tables)],
        "invalid_runs": [invalid_runs_table(tables)],
        ATTEMPTS_TABLE: [attempts_table(tables)],
        "runs": [runs_table(tables)],
    }
    if is_release_series(settings, tables):
        sections = {"releases": [releases_table(tables, settings)], **sections}
    if MAP_TABLE in tables:
        sections[MAP_BY_QUOTA_TABLE] = [map_by_quota_table(tables[MAP_BY_QUOTA_TABLE])]
        sections[MAP_CONTRAST_TABLE] = [map_contrast_table(tables[MAP_CONTRAST_TABLE])]
        sections[MAP_TABLE] = [map_cells_table(tables[MAP_TABLE])]
    if FIXES_TABLE in tables:
        sections = {FIXES_TABLE: [fixes_table(tables[FIXES_TABLE])], **sections}
    if CROSSCHECK_TABLE in tables:
        sections[CROSSCHECK_TABLE] = crosscheck_tables(
            tables[CROSSCHECK_TABLE], tables[CROSSCHECK_RUNS_TABLE]
        )
    return sections
