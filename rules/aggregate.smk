# Aggregation and the report: per-run figures, medians over valid runs, ratios and
# the study's claims as tables (CSV), and one self-contained HTML page that puts the
# study's numbers beside ours.


rule aggregate:
    input:
        metrics=run_metrics_files(),
    output:
        runs="results/{experiment}/tables/runs.csv",
        arms=report(
            "results/{experiment}/tables/arms.csv",
            caption="../report/arms_table.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"table": "arms"},
        ),
        ratios="results/{experiment}/tables/ratios.csv",
        invalid_runs="results/{experiment}/tables/invalid_runs.csv",
        claims="results/{experiment}/tables/claims.csv",
    log:
        "results/logs/aggregate/{experiment}.log",
    conda:
        "../envs/workflow.yaml"
    params:
        config=config,
    script:
        "../scripts/aggregate.py"


rule report_html:
    input:
        runs=rules.aggregate.output.runs,
        arms=rules.aggregate.output.arms,
        ratios=rules.aggregate.output.ratios,
        invalid_runs=rules.aggregate.output.invalid_runs,
        claims=rules.aggregate.output.claims,
        host="results/{experiment}/host.json",
        variants=variant_identity_files(),
    output:
        html=report(
            "results/{experiment}/report.html",
            caption="../report/report_page.rst",
            category="{experiment}",
            labels={"page": "study report"},
        ),
    log:
        "results/logs/report_html/{experiment}.log",
    conda:
        "../envs/workflow.yaml"
    params:
        config=config,
    script:
        "../scripts/report_html.py"
