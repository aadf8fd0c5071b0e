"""One self-contained HTML page that states what this experiment found.

The page opens with a plain sentence per claim (holds, does not hold, cannot
tell), and for a release series where each figure first changed; then the
setup (host, quota, threads, GPU, engine, variants, run dates), the figures,
and the tables: arms beside the study's numbers, ratios, claim verdicts,
invalid runs and every run (and each release against the one before it).
The Vega, Vega-Lite and vega-embed libraries are inlined once from
vl-convert's bundle, so the page loads nothing from the network. Every
string that comes from a config, a host description or a log is
HTML-escaped; chart specs travel as JSON script blocks with `<`, `>` and `&`
escaped so no string can close its tag.

With a figures directory, each figure is also written as its own page and as
its Vega-Lite spec (`<name>.html`, `<name>.vl.json`), and each table as its
own page (`table_<name>.html`), for Snakemake's `report()`.
"""

import functools
import html
import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import vl_convert

from serving_study.analysis.aggregate import (
    BOOTSTRAP_RESAMPLES,
    CANNOT_TELL,
    DOES_NOT_HOLD,
    HOLDS,
    MAP_TABLE,
    MIN_RUNS_FOR_INTERVAL,
    describe_environment,
    format_number,
    is_number,
)
from serving_study.analysis.fix_comparison import FIXES_TABLE
from serving_study.analysis.release_change import (
    ChangeCriterion,
    describe_first_change,
    false_alarm_chance,
)
from serving_study.config.platform import CPU_HOST_DIFFERENCES
from serving_study.measure.run_metrics import METRICS
from serving_study.report.charts import (
    FIGURE_TITLES,
    chart_specs,
    has_several_concurrencies,
    is_release_series,
)

FIGURE_CAPTIONS = {
    "release_series": (
        "Per release, in release order: the median over valid runs (colored by "
        "how it compares with the release before), its [min, max] (vertical "
        "rule) and each valid run (black dots). The dashed red line marks the "
        "first release whose runs differ from the release before beyond the "
        "run-to-run spread: [min, max] ranges apart and medians at least the "
        "configured smallest change apart."
    ),
    "throughput_vs_concurrency": (
        "Median throughput over valid runs at each concurrency, one line per "
        "transport; vertical rules span the runs' [min, max], dots are single "
        "runs, dashed lines are the study's numbers."
    ),
    "arm_comparison": (
        "Per arm: the reproduction's median over valid runs (blue bar) with its "
        "[min, max] (black rule) and each valid run (black dots), beside the "
        "study's reference value (gold bar) where the study reported one."
    ),
    "which_fix": (
        "Median throughput over valid runs under the quota: the trap (the "
        "original copy with default intra-op threads) and each fix, labelled with "
        "its ratio to the trap. What each fix costs is in the table beside it."
    ),
    "thread_quota_map": (
        "Throughput of one measured window per cell: intra-op threads of the main "
        "process (forced with torch.set_num_threads) across, the server's CPU "
        "quota down. One server per row, its quota changed live between cells. "
        "The last panel divides the second variant's throughput by the first's "
        "(above 1: the second serves more). Invalid cells are left empty."
    ),
}

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
    "error_count",
)

TABLE_TITLES = {
    "arms": "Arms: medians over valid runs, with the study's numbers",
    "ratios": "Ratios of arm medians",
    "claims": "Claims and verdicts",
    "invalid_runs": "Invalid runs, left out of every median",
    "runs": "Every run",
    "releases": "Releases: each against the release before",
    MAP_TABLE: "Thread x quota map: every cell",
    FIXES_TABLE: "Which fix: throughput, latency and CPU cost of each",
}

# Only the export action: "source" and "compiled" write the spec's text (strings
# from config and logs) into a new window as HTML, "editor" posts it to the
# Vega Editor's site.
EMBED_OPTIONS = {
    "renderer": "svg",
    "actions": {"export": True, "source": False, "compiled": False, "editor": False},
}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 75em;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left;
         vertical-align: top; }
th { background: #f2f2f2; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
li.holds, tr.holds td.verdict { color: #1d6b2a; }
li.does-not-hold, tr.does-not-hold td.verdict { color: #a32020; }
li.cannot-tell, tr.cannot-tell td.verdict { color: #8a6d00; }
.verdicts li { margin-bottom: 0.3em; }
.note { color: #555; font-size: 0.9em; }
figure { margin: 1em 0 2em; }
"""


def build_report(
    tables: dict[str, pd.DataFrame],
    config: dict,
    host: dict,
    variants: list[dict],
    out_html: Path,
    figures_dir: Path | None = None,
) -> list[Path]:
    """Write the report page (and, with figures_dir, the per-item pages).

    Returns every file written.
    """
    specs = chart_specs(tables, config)
    shown = ["arm_comparison"]
    if has_several_concurrencies(config):
        shown.insert(0, "throughput_vs_concurrency")
    if "release_series" in specs:
        shown.insert(0, "release_series")
    if "thread_quota_map" in specs:
        shown.append("thread_quota_map")
    if "which_fix" in specs:
        shown.append("which_fix")
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(
        render_report(tables, config, host, variants, {n: specs[n] for n in shown}),
        encoding="utf-8",
    )
    written = [out_html]
    if figures_dir is not None:
        written += write_report_items(tables, config, specs, Path(figures_dir))
    return written


def write_report_items(
    tables: dict[str, pd.DataFrame], config: dict, specs: dict, figures_dir: Path
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
            page(FIGURE_TITLES[name], body, with_charts=True), encoding="utf-8"
        )
        written += [spec_path, page_path]
    for name, body in table_sections(tables, config).items():
        path = figures_dir / f"table_{name}.html"
        path.write_text(page(TABLE_TITLES[name], body), encoding="utf-8")
        written.append(path)
    return written


def render_report(
    tables: dict[str, pd.DataFrame],
    config: dict,
    host: dict,
    variants: list[dict],
    specs: dict[str, dict],
) -> str:
    """The whole report page as a string."""
    experiment = config.get("experiment", "experiment")
    parts = [
        f"<h1>{escape(experiment)}</h1>",
        f"<p>{escape(config.get('description', ''))}</p>",
        "<h2>Verdicts</h2>",
        verdicts_html(tables),
        release_change_html(tables, config),
        "<h2>Setup</h2>",
        setup_html(tables, config, host),
        platform_html(config),
        "<h3>Variants</h3>",
        variants_html(variants),
        "<h2>Figures</h2>",
        *(figure_html(name, spec) for name, spec in specs.items()),
    ]
    for name, section in table_sections(tables, config).items():
        parts += [f"<h2>{escape(TABLE_TITLES[name])}</h2>", section]
    parts += ["<h2>How the numbers were made</h2>", method_html(config)]
    return page(
        f"{experiment}: serving study report", "\n".join(parts), with_charts=bool(specs)
    )


# --- page frame and charts ----------------------------------------------------


def page(title: str, body: str, with_charts: bool = False) -> str:
    """A complete HTML document; with charts, the inlined libraries and embedder."""
    head_script = ""
    embed_script = ""
    if with_charts:
        head_script = f'<script type="text/javascript">{vega_bundle()}</script>'
        embed_script = (
            f'<script type="text/javascript">{embed_charts_script()}</script>'
        )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)}</title>\n<style>{STYLE}</style>\n"
        f"{head_script}\n</head>\n<body>\n{body}\n{embed_script}\n</body>\n</html>\n"
    )


@functools.cache
def vega_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one script, with no network imports."""
    return vl_convert.javascript_bundle().replace("</script", "<\\/script")


def embed_charts_script() -> str:
    options = json.dumps(EMBED_OPTIONS)
    return (
        "document.querySelectorAll('script[data-chart]').forEach(function (node) {"
        f" vegaEmbed('#' + node.dataset.chart, JSON.parse(node.textContent), {options})"
        ".catch(console.error); });"
    )


def figure_html(name: str, spec: dict) -> str:
    return (
        f'<figure id="figure-{name}">\n'
        f'<div id="chart-{name}"></div>\n'
        f'<script type="application/json" data-chart="chart-{name}">'
        f"{script_json(spec)}</script>\n"
        f"<figcaption><strong>{escape(FIGURE_TITLES[name])}.</strong> "
        f"{escape(FIGURE_CAPTIONS[name])}</figcaption>\n</figure>"
    )


def script_json(value) -> str:
    """JSON that is safe inside a <script> element: no tag can be closed."""
    return (
        json.dumps(value, allow_nan=False)
        .replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
    )


# --- header sections ----------------------------------------------------------


def verdicts_html(tables: dict[str, pd.DataFrame]) -> str:
    items = []
    for claim in tables["claims"].to_dict("records"):
        css = verdict_class(claim["verdict"])
        items.append(f'<li class="{css}">{escape(claim["sentence"])}.</li>')
    if not items:
        items.append("<li>The config states no claims.</li>")
    runs = tables["runs"]
    invalid = int((~runs["valid"].astype(bool)).sum())
    if invalid:
        were = "was" if invalid == 1 else "were"
        note = (
            f"{invalid} of {len(runs)} runs {were} invalid and left out of every "
            "median (see the invalid runs below)."
        )
    else:
        note = f"All {len(runs)} runs were valid."
    return f'<ul class="verdicts">{"".join(items)}</ul>\n<p class="note">{note}</p>'


def verdict_class(verdict: str) -> str:
    return {
        HOLDS: "holds",
        DOES_NOT_HOLD: "does-not-hold",
        CANNOT_TELL: "cannot-tell",
    }.get(verdict, "")


def setup_html(tables: dict[str, pd.DataFrame], config: dict, host: dict) -> str:
    host_rows = host_summary_rows(host) + [["runs measured", run_dates(tables["runs"])]]
    if (config.get("reference") or {}).get("source"):
        host_rows.append(
            ["study numbers from", describe(config["reference"]["source"])]
        )
    arm_rows = []
    runs = tables["runs"]
    for arm in config["arms"]:
        arm_runs = runs[runs["arm"] == arm["name"]]
        threads = sorted({int(t) for t in arm_runs["torch_threads"].dropna()})
        arm_rows.append(
            [
                arm["name"],
                describe(arm.get("variant")),
                describe(arm.get("workload")),
                describe(arm.get("transport")),
                describe(arm.get("concurrency")),
                describe(arm.get("cpu_quota")),
                describe_environment(arm.get("environment")),
                ", ".join(str(t) for t in threads) or "not recorded",
                f"{int(arm_runs['valid'].astype(bool).sum())} of {len(arm_runs)}",
            ]
        )
    arm_header = [
        "arm",
        "variant",
        "workload",
        "transport",
        "concurrency",
        "CPU quota (cores)",
        "environment",
        "intra-op threads seen",
        "valid runs",
    ]
    return html_table(["setting", "value"], host_rows) + html_table(
        arm_header, arm_rows
    )


def variants_html(variants: list[dict]) -> str:
    rows = []
    for variant in variants:
        patch = variant.get("patch") or variant.get("pull_request") or {}
        rows.append(
            [
                describe(variant.get("name")),
                source_text(variant.get("source") or {}),
                describe(patch.get("file")) if patch else "none (unpatched)",
                describe(patch.get("sha256")) if patch else "",
                describe(variant.get("mm_utils_sha256")),
            ]
        )
    header = ["variant", "source", "patch", "patch sha256", "mm_utils.py sha256"]
    return html_table(header, rows)


def source_text(source: dict) -> str:
    """One line naming where a variant's engine source came from, with its hash."""
    kind = source.get("kind")
    if kind == "pypi":
        return (
            f"PyPI {source.get('package')} {source.get('version')} "
            f"({source.get('file')}, sha256 {source.get('sha256')})"
        )
    if kind == "git":
        return f"git {source.get('url')} at {source.get('commit')}"
    if kind == "path":
        return f"local copy {source.get('path')} (sha256 {source.get('sha256')})"
    return describe(source)


def host_summary_rows(host: dict) -> list[list[str]]:
    """The host description (results/<experiment>/host.json) as readable rows."""
    if not host:
        return [["host", "not recorded"]]
    gpu = host.get("gpu") or {}
    gpus = gpu.get("gpus") or []
    gpu_text = (
        "; ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in gpus)
        + f", driver {gpu.get('driver')}"
        if gpus
        else f"none ({gpu.get('reason') or 'not recorded'})"
    )
    runtimes = []
    for name, runtime in sorted((host.get("container_runtimes") or {}).items()):
        if not runtime.get("installed"):
            runtimes.append(f"{name}: not installed")
        else:
            state = (
                "engine running"
                if runtime.get("engine_reachable")
                else ("engine not running")
            )
            runtimes.append(f"{runtime.get('version')} ({state})")
    versions = host.get("versions") or {}
    return [
        ["host", describe(host.get("hostname"))],
        [
            "CPU",
            f"{describe(host.get('cpu_model'))}: {describe(host.get('visible_cpus'))} "
            f"visible of {describe(host.get('cpu_count'))}",
        ],
        ["memory", f"{describe(host.get('memory_gib'))} GiB"],
        [
            "kernel, cgroup",
            f"{describe(host.get('kernel'))}, "
            f"cgroup {describe(host.get('cgroup_version'))}",
        ],
        ["GPU", gpu_text],
        [
            "engine, runtime",
            f"{describe(host.get('engine'))}, {describe(host.get('runtime'))}",
        ],
        ["container runtimes", "; ".join(runtimes) or "not recorded"],
        ["free /dev/shm", f"{describe(host.get('shared_memory_free_mib'))} MiB"],
        [
            "software",
            ", ".join(f"{name} {version}" for name, version in versions.items()),
        ],
    ]


def run_dates(runs: pd.DataFrame) -> str:
    starts = runs["window_start_epoch"].dropna()
    ends = runs["window_end_epoch"].dropna()
    if starts.empty:
        return "no run recorded its measurement window"
    first = datetime.fromtimestamp(float(starts.min()), tz=UTC)
    last = datetime.fromtimestamp(
        float(ends.max() if not ends.empty else starts.max()), tz=UTC
    )
    return f"{first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC"


def platform_html(config: dict) -> str:
    """For real SGLang on a CPU host: what differs from a GPU host, and which arms
    have the quota on the main process alone."""
    sglang = config.get("sglang") or {}
    if config.get("engine") != "sglang" or sglang.get("device") != "cpu":
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in CPU_HOST_DIFFERENCES)
    main_only = [
        arm["name"]
        for arm in config.get("arms", [])
        if arm.get("quota_scope") == "main_process"
    ]
    scope = (
        "<p>The quota binds the main process alone (the scheduler and detokenizer "
        f"in a cgroup of their own) in: {escape(', '.join(main_only))}; the whole "
        "server elsewhere.</p>"
        if main_only
        else ""
    )
    return (
        "<h3>SGLang's real server on CPU: what differs from a GPU host</h3>"
        f"<ul>{items}</ul>{scope}"
    )


def method_html(config: dict) -> str:
    return (
        "<p>Each run sends its warm-up requests first and measures only the "
        "requests after them. Throughput is the number of measured requests that "
        "completed, divided by the time from the first measured send to the last "
        "measured completion. Latency percentiles interpolate linearly between "
        "completed requests. CPU figures come from samplers outside the server's "
        "cgroup: per-process CPU from process times, cores used and throttled "
        "periods from the cgroup's own counters.</p>"
        "<p>A run counts only if every measured request completed without error, "
        "the server kept its processes, the CPU quota and environment seen in the "
        "server match the arm, the warm-up count matches, and the client kept to "
        "its send schedule. Arm figures are medians over the runs that count, "
        "shown with their [min, max]. A bootstrap 95% interval of the median "
        f"({BOOTSTRAP_RESAMPLES:,} resamples) is given only from "
        f"{MIN_RUNS_FOR_INTERVAL} valid runs on: with fewer, resampled medians "
        "can only repeat the observed values. Ratios are ratios of medians; where "
        "both arms have a valid run in the same repetition block, the ratio within "
        "each block is listed too.</p>"
    )


# --- tables -------------------------------------------------------------------


def table_sections(tables: dict[str, pd.DataFrame], config: dict) -> dict[str, str]:
    sections = {
        "arms": arms_html(tables),
        "ratios": ratios_html(tables),
        "claims": claims_html(tables),
        "invalid_runs": invalid_runs_html(tables),
        "runs": runs_html(tables),
    }
    if is_release_series(config, tables):
        sections = {"releases": releases_html(tables, config), **sections}
    if MAP_TABLE in tables:
        sections[MAP_TABLE] = map_cells_html(tables[MAP_TABLE])
    if FIXES_TABLE in tables:
        sections = {FIXES_TABLE: fixes_html(tables[FIXES_TABLE]), **sections}
    return sections


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


def map_cells_html(cells: pd.DataFrame) -> str:
    # The cell figures the table holds, without those no cell measured (GPU).
    columns = [c for c in cells.columns if c in METRICS and cells[c].notna().any()]
    header = ["variant", "intra-op threads", "quota (cores)", "valid"] + [
        f"{METRICS[column].label} ({METRICS[column].unit})" for column in columns
    ]
    header.append("why invalid")
    rows = [
        [
            row["variant"],
            text(row["intra_op_threads"]),
            text(row["cpu_quota"]),
            "yes" if row["valid"] else "no",
            *(format_number(row[column]) for column in columns),
            text(row["invalid_reason"]),
        ]
        for row in cells.to_dict("records")
    ]
    return html_table(header, rows, numeric_from=4)


def release_change_html(tables: dict[str, pd.DataFrame], config: dict) -> str:
    """Where each figure of a release series first changed, or nothing."""
    if not is_release_series(config, tables):
        return ""
    releases = tables["releases"]
    items = "".join(
        f"<li>{escape(describe_first_change(releases, metric))}</li>"
        for metric in dict.fromkeys(releases["metric"])
    )
    return f'<h3>Release series</h3><ul class="verdicts">{items}</ul>'


def releases_html(tables: dict[str, pd.DataFrame], config: dict) -> str:
    releases = tables["releases"]
    criterion = ChangeCriterion.from_config(config.get("change_criterion"))
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
        header.append(f"{METRICS[metric].label} ({METRICS[metric].unit})")
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


def summary_text(summary) -> str:
    if not is_number(summary["median"]):
        return "–"
    median = format_number(summary["median"])
    spread = f"[{format_number(summary['min'])}–{format_number(summary['max'])}]"
    interval = interval_text(summary)
    return f"{median} {spread}" + (f", 95% CI {interval}" if interval else "")


def interval_text(summary) -> str:
    if not is_number(summary["ci_low"]):
        return ""
    return f"{format_number(summary['ci_low'])}–{format_number(summary['ci_high'])}"


def ratios_html(tables: dict[str, pd.DataFrame]) -> str:
    ratios = tables["ratios"]
    if ratios.empty:
        return "<p>No ratio claims.</p>"
    header = [
        "claim",
        "figure",
        "numerator",
        "denominator",
        "medians",
        "ratio of medians",
        "study",
        "per block",
    ]
    rows = [
        [
            row["claim"],
            METRICS[row["metric"]].label,
            row["numerator"],
            row["denominator"],
            f"{format_number(row['numerator_median'])} / "
            f"{format_number(row['denominator_median'])}",
            ratio_text(row["ratio_of_medians"]),
            ratio_text(row["reference_ratio"]),
            text(row["block_ratios"]) or "no paired blocks",
        ]
        for row in ratios.to_dict("records")
    ]
    return html_table(header, rows)


def claims_html(tables: dict[str, pd.DataFrame]) -> str:
    claims = tables["claims"]
    if claims.empty:
        return "<p>The config states no claims.</p>"
    header = ["claim", "statement", "arms", "needs", "verdict", "numbers"]
    records = claims.to_dict("records")
    rows = [
        [
            row["claim"],
            row["statement"],
            row["arms"],
            row["bound"],
            row["verdict"],
            row["detail"],
        ]
        for row in records
    ]
    row_classes = [verdict_class(row["verdict"]) for row in records]
    return html_table(header, rows, row_classes=row_classes, verdict_column=4)


def invalid_runs_html(tables: dict[str, pd.DataFrame]) -> str:
    invalid = tables["invalid_runs"]
    if invalid.empty:
        return "<p>None: every run counts.</p>"
    rows = [
        [row["arm"], text(row["run"]), text(row["reasons"])]
        for row in invalid.to_dict("records")
    ]
    return html_table(["arm", "run", "reasons"], rows)


def runs_html(tables: dict[str, pd.DataFrame]) -> str:
    runs = tables["runs"]
    header = ["arm", "run", "valid"] + [
        f"{METRICS[c].label} ({METRICS[c].unit})"
        if c in METRICS
        else c.replace("_", " ")
        for c in RUN_COLUMNS
    ]
    rows = [
        [row["arm"], text(row["run"]), "yes" if row["valid"] else "no"]
        + [format_number(row[column]) for column in RUN_COLUMNS]
        for row in runs.to_dict("records")
    ]
    return html_table(header, rows, numeric_from=3)


def html_table(
    header: list[str],
    rows: list[list],
    numeric_from: int | None = None,
    row_classes: list[str] | None = None,
    verdict_column: int | None = None,
) -> str:
    """A table whose every cell is escaped text."""
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
    body = []
    for index, row in enumerate(rows):
        cells = []
        for column, cell in enumerate(row):
            classes = []
            if numeric_from is not None and column >= numeric_from:
                classes.append("number")
            if column == verdict_column:
                classes.append("verdict")
            attribute = f' class="{" ".join(classes)}"' if classes else ""
            cells.append(f"<td{attribute}>{escape(cell)}</td>")
        css = row_classes[index] if row_classes else ""
        attribute = f' class="{css}"' if css else ""
        body.append(f"<tr{attribute}>{''.join(cells)}</tr>")
    return (
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


# --- small text helpers -------------------------------------------------------


def escape(value) -> str:
    return html.escape(text(value), quote=True)


def text(value) -> str:
    """A cell's text: empty for missing values, whole numbers without '.0'."""
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value.is_integer():
            return str(int(value))
    return str(value)


def describe(value) -> str:
    """A config or host value as text; nested values as compact JSON."""
    if value is None:
        return "none"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return text(value)


def ratio_text(value) -> str:
    return f"{value:.3g}x" if is_number(value) else "–"
