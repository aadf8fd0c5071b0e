"""One self-contained HTML page that states what this experiment found.

The page opens with a plain sentence per claim (holds, does not hold, cannot
tell), and for a release series where each figure first changed; then the
setup (host, quota, threads, GPU, engine, variants, run dates), the figures,
and the tables: arms beside the study's numbers, ratios, claim verdicts,
invalid runs, earlier attempts (only when a run has any) and every run (and
each release against the one before it).
Every string that comes from a config, a host description or a log is
HTML-escaped (markup.py); the page loads nothing from the network
(document.py).

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
from serving_study.analysis.fix_comparison import FIXES_TABLE
from serving_study.report.charts import chart_specs
from serving_study.report.document import html_document
from serving_study.report.figures import FIGURE_TITLES, figure_html, shown_figures
from serving_study.report.fixes import fixes_html
from serving_study.report.markup import escape
from serving_study.report.method import method_html
from serving_study.report.releases import (
    is_release_series,
    release_change_html,
    releases_html,
)
from serving_study.report.settings import ReportSettings
from serving_study.report.study_setup import platform_html, setup_html, variants_html
from serving_study.report.tables import (
    arms_html,
    attempts_html,
    invalid_runs_html,
    map_by_quota_html,
    map_cells_html,
    map_contrast_html,
    runs_html,
)
from serving_study.report.verdicts import claims_html, ratios_html, verdicts_html

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
}


def build_report(
    tables: dict[str, pd.DataFrame],
    settings: ReportSettings,
    host: dict,
    variants: list[dict],
    out_html: Path,
    figures_dir: Path | None = None,
) -> list[Path]:
    """Write the report page (and, with figures_dir, the per-item pages).

    Returns every file written.
    """
    specs = chart_specs(tables, settings)
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(
        render_report(
            tables, settings, host, variants, shown_figures(specs, settings.arms)
        ),
        encoding="utf-8",
    )
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
    for name, spec in specs.items():
        spec_path = figures_dir / f"{name}.vl.json"
        spec_path.write_text(
            json.dumps(spec, indent=1, allow_nan=False), encoding="utf-8"
        )
        page_path = figures_dir / f"{name}.html"
        body = figure_html(name, spec)
        page_path.write_text(
            html_document(FIGURE_TITLES[name], body, with_charts=True),
            encoding="utf-8",
        )
        written += [spec_path, page_path]
    for name, body in table_sections(tables, settings).items():
        path = figures_dir / f"table_{name}.html"
        path.write_text(html_document(TABLE_TITLES[name], body), encoding="utf-8")
        written.append(path)
    return written


def render_report(
    tables: dict[str, pd.DataFrame],
    settings: ReportSettings,
    host: dict,
    variants: list[dict],
    specs: dict[str, dict],
) -> str:
    """The whole report page as a string."""
    experiment = settings.experiment
    parts = [
        f"<h1>{escape(experiment)}</h1>",
        f"<p>{escape(settings.description)}</p>",
        "<h2>Verdicts</h2>",
        verdicts_html(tables),
        release_change_html(tables, settings),
        "<h2>Setup</h2>",
        setup_html(tables, settings, host),
        platform_html(settings),
        "<h3>Variants</h3>",
        variants_html(variants),
        "<h2>Figures</h2>",
        *(figure_html(name, spec) for name, spec in specs.items()),
    ]
    for name, section in page_sections(tables, settings).items():
        parts += [f"<h2>{escape(TABLE_TITLES[name])}</h2>", section]
    parts += ["<h2>How the numbers were made</h2>", method_html()]
    return html_document(
        f"{experiment}: serving study report", "\n".join(parts), with_charts=bool(specs)
    )


def table_sections(
    tables: dict[str, pd.DataFrame], settings: ReportSettings
) -> dict[str, str]:
    """Each table as HTML, keyed by table name, in the page's order."""
    sections = {
        "arms": arms_html(tables),
        "ratios": ratios_html(tables),
        "claims": claims_html(tables),
        "invalid_runs": invalid_runs_html(tables),
        ATTEMPTS_TABLE: attempts_html(tables),
        "runs": runs_html(tables),
    }
    if is_release_series(settings, tables):
        sections = {"releases": releases_html(tables, settings), **sections}
    if MAP_TABLE in tables:
        sections[MAP_BY_QUOTA_TABLE] = map_by_quota_html(tables[MAP_BY_QUOTA_TABLE])
        sections[MAP_CONTRAST_TABLE] = map_contrast_html(tables[MAP_CONTRAST_TABLE])
        sections[MAP_TABLE] = map_cells_html(tables[MAP_TABLE])
    if FIXES_TABLE in tables:
        sections = {FIXES_TABLE: fixes_html(tables[FIXES_TABLE]), **sections}
    return sections


def page_sections(
    tables: dict[str, pd.DataFrame], settings: ReportSettings
) -> dict[str, str]:
    """The tables the report page shows: each of table_sections, but the earlier
    attempts only when a run has any (their own page is always written)."""
    sections = table_sections(tables, settings)
    if tables[ATTEMPTS_TABLE].empty:
        del sections[ATTEMPTS_TABLE]
    return sections
