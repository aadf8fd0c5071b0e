# Aggregation and the report: per-run figures, medians over valid runs, ratios and
# the study's claims as tables (CSV), one self-contained HTML page that puts the
# study's numbers beside ours, and the same figures and tables as items of
# Snakemake's own report (snakemake --report).

# A release series (config: release_series) adds a table of each release against the
# one before it, its figure and its table page.
RELEASE_TABLE_OUTPUT = (
    {"releases": "results/{experiment}/tables/releases.csv"}
    if config["release_series"]
    else {}
)
# A fixes section (config: fixes) adds the "which fix" table.
FIXES_TABLE_OUTPUT = (
    {"fixes": "results/{experiment}/tables/fixes.csv"} if config.get("fixes") else {}
)
RELEASE_REPORT_ITEMS = (
    {
        "release_figure": report(
            "results/{experiment}/figures/release_series.html",
            caption="../report/release_series.rst",
            category="{experiment}",
            subcategory="Figures",
            labels={"item": "releases in order, first change marked"},
        ),
        "releases_table": report(
            "results/{experiment}/figures/table_releases.html",
            caption="../report/table_releases.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "each release against the one before"},
        ),
    }
    if config["release_series"]
    else {}
)

# A thread x quota map (config: thread_quota_map) adds its heatmaps and tables.
MAP_REPORT_ITEMS = (
    {
        "map_figure": report(
            "results/{experiment}/figures/thread_quota_map.html",
            caption="../report/thread_quota_map.rst",
            category="{experiment}",
            subcategory="Figures",
            labels={"item": "throughput over intra-op threads and quota"},
        ),
        "map_table": report(
            "results/{experiment}/figures/table_thread_quota_map.html",
            caption="../report/table_thread_quota_map.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "thread x quota map: every cell"},
        ),
        "map_contrast_table": report(
            "results/{experiment}/figures/table_thread_quota_map_contrast.html",
            caption="../report/table_thread_quota_map_contrast.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "thread x quota map: the variants compared"},
        ),
        "map_by_quota_table": report(
            "results/{experiment}/figures/table_thread_quota_map_by_quota.html",
            caption="../report/table_thread_quota_map_by_quota.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "thread x quota map: the variants compared per quota"},
        ),
    }
    if config.get("thread_quota_map")
    else {}
)

FIXES_REPORT_ITEMS = (
    {
        "fixes_figure": report(
            "results/{experiment}/figures/which_fix.html",
            caption="../report/which_fix.rst",
            category="{experiment}",
            subcategory="Figures",
            labels={"item": "which fix: throughput under the quota"},
        ),
        "fixes_table": report(
            "results/{experiment}/figures/table_fixes.html",
            caption="../report/table_fixes.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "which fix: throughput and CPU cost of each"},
        ),
    }
    if config.get("fixes")
    else {}
)


rule aggregate:
    input:
        metrics=run_metrics_files(),
        # Beside each run's metrics, in the same order: its earlier attempts, and
        # whether the node it ran on differs from host.json.
        attempts=run_attempts_files(),
        provenance=run_provenance_files(),
    output:
        **RELEASE_TABLE_OUTPUT,
        **FIXES_TABLE_OUTPUT,
        runs="results/{experiment}/tables/runs.csv",
        arms="results/{experiment}/tables/arms.csv",
        ratios="results/{experiment}/tables/ratios.csv",
        invalid_runs="results/{experiment}/tables/invalid_runs.csv",
        attempts="results/{experiment}/tables/attempts.csv",
        claims="results/{experiment}/tables/claims.csv",
    log:
        "results/logs/aggregate/{experiment}.log",
    benchmark:
        "results/benchmarks/jobs/aggregate/{experiment}.tsv"
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        config=config_part(ANALYSIS_KEYS),
    script:
        "../scripts/aggregate.py"


rule report_html:
    input:
        tables=rules.aggregate.output,
        map_tables=map_table_files(),
        crosscheck_tables=crosscheck_table_files(),
        host="results/{experiment}/host.json",
        variants=variant_identity_files(),
        # Every run's: the report draws one run per arm over time, chosen from
        # the runs table (analysis/run_timelines.py).
        requests=run_files("requests.jsonl"),
        monitors=run_files("monitors.json"),
    output:
        **RELEASE_REPORT_ITEMS,
        **MAP_REPORT_ITEMS,
        **FIXES_REPORT_ITEMS,
        **CROSSCHECK_REPORT_ITEMS,
        html=report(
            "results/{experiment}/report.html",
            caption="../report/report_page.rst",
            category="{experiment}",
            subcategory="Report page",
            labels={"item": "whole report"},
        ),
        figure_1=report(
            "results/{experiment}/figures/throughput_vs_concurrency.html",
            caption="../report/throughput_vs_concurrency.rst",
            category="{experiment}",
            subcategory="Figures",
            labels={"item": "Figure 1: throughput vs concurrency"},
        ),
        figure_4=report(
            "results/{experiment}/figures/arm_comparison.html",
            caption="../report/arm_comparison.rst",
            category="{experiment}",
            subcategory="Figures",
            labels={"item": "Figure 4: arms side by side"},
        ),
        run_timelines=report(
            "results/{experiment}/figures/run_timelines.html",
            caption="../report/run_timelines.rst",
            category="{experiment}",
            subcategory="Figures",
            labels={"item": "one run per arm over time"},
        ),
        arms_table=report(
            "results/{experiment}/figures/table_arms.html",
            caption="../report/table_arms.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "arms: medians beside the study"},
        ),
        claims_table=report(
            "results/{experiment}/figures/table_claims.html",
            caption="../report/table_claims.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "claims and verdicts"},
        ),
        ratios_table=report(
            "results/{experiment}/figures/table_ratios.html",
            caption="../report/table_ratios.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "ratios between arms"},
        ),
        invalid_runs_table=report(
            "results/{experiment}/figures/table_invalid_runs.html",
            caption="../report/table_invalid_runs.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "invalid runs and why"},
        ),
        attempts_table=report(
            "results/{experiment}/figures/table_attempts.html",
            caption="../report/table_attempts.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "earlier attempts, never in a median"},
        ),
        runs_table=report(
            "results/{experiment}/figures/table_runs.html",
            caption="../report/table_runs.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "every run"},
        ),
    log:
        "results/logs/report_html/{experiment}.log",
    benchmark:
        "results/benchmarks/jobs/report_html/{experiment}.tsv"
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        config=report_config(),
    script:
        "../scripts/report_html.py"
