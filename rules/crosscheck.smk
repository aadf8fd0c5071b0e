# Our client against SGLang's own bench_serving (config: client_crosscheck), and any
# run of ours in bench_serving's result format.
#
# Each pair is two runs of the arm on fresh servers started from its launch plan,
# ours and bench_serving's in alternating order (studies/client_crosscheck.py).
# bench_serving runs outside the server's cgroup from the release the arm's variant
# is made from (its fetched tree, unpatched), in the real server's CPU runtime
# (rules/runtime.smk), and sends our workload as its `openai` dataset, line for line
# our client's measured requests (studies/bench_serving_dataset.py), which each pair
# writes for itself and removes (about 270 kB a 512 px image). It reads a
# tokenizer from a local folder: the served model's with engine sglang; otherwise
# the default tiny Qwen3-VL's, which counts an image as its placeholder tokens, as
# any Qwen-VL template does (the count is bench_serving's input tokens, no figure
# of the cross-check). The table judges the throughputs (analysis/crosscheck_table.py)
# and the report shows it. Part of `all` when configured:
# `snakemake --cores 1 client_crosscheck --configfile <config> <overlay naming the arm>`.


# The report shows the cross-check's table when the config asks for it.
CROSSCHECK_REPORT_ITEMS = (
    {
        "crosscheck_table": report(
            "results/{experiment}/figures/table_client_crosscheck.html",
            caption="../report/table_client_crosscheck.rst",
            category="{experiment}",
            subcategory="Tables",
            labels={"item": "our client against bench_serving"},
        ),
    }
    if CROSSCHECK
    else {}
)


# Any run's figures as bench_serving writes its own (studies/bench_serving_result.py):
# `snakemake --cores 1 results/<experiment>/<arm>/run<k>/bench_serving.json`.
rule bench_serving_export:
    input:
        requests="results/{experiment}/{arm}/run{run}/requests.jsonl",
        metrics="results/{experiment}/{arm}/run{run}/metrics.json",
        provenance="results/{experiment}/{arm}/run{run}/provenance.json",
    output:
        result="results/{experiment}/{arm}/run{run}/bench_serving.json",
    log:
        "results/logs/bench_serving_export/{experiment}/{arm}/run{run}.log",
    localrule: True
    conda:
        "../envs/workflow.yaml"
    script:
        "../scripts/bench_serving_export.py"


if config.get("client_crosscheck"):
    from serving_study.config.record_fields import config_values
    from serving_study.sources.tiny_model_settings import CONFIG_KEYS
    from serving_study.studies.client_crosscheck import crosscheck_arm

    # The arm as both clients run it, with the cross-check's measured requests.
    CROSSCHECK_ARM = crosscheck_arm(ARMS[CROSSCHECK.arm], CROSSCHECK)
    CROSSCHECK_DIRECTORY = f"results/{EXPERIMENT}/crosscheck/{CROSSCHECK.arm}"

    rule crosscheck_tokenizer:
        output:
            snapshot="results/{experiment}/crosscheck/tokenizer/snapshot.json",
            model=directory("results/{experiment}/crosscheck/tokenizer/model"),
        log:
            "results/logs/crosscheck_tokenizer/{experiment}.log",
        localrule: True
        conda:
            "../envs/workflow.yaml"
        params:
            # The tiny model's defaults from the schema.
            settings=config_values({}, CONFIG_KEYS, "sglang", "tiny_model"),
        script:
            "../scripts/tiny_model.py"

    rule crosscheck_pair:
        input:
            plan=launch_plan_of_arm,
            variant=variant_of_arm,
            workload=workload_of_arm,
            host="results/{experiment}/host.json",
            preflight="results/{experiment}/preflight/{arm}.json",
            image=image_of_arm,
            model=model_of_engine,
            patch=patch_of_arm,
            # bench_serving's runtime, its release and its tokenizer.
            runtime=SGLANG_RUNTIME,
            release=lambda wildcards: f"{release_of_arm(wildcards)}/identity.json",
            release_tree=lambda wildcards: f"{release_of_arm(wildcards)}/tree",
            tokenizer=crosscheck_tokenizer(),
        output:
            record="results/{experiment}/crosscheck/{arm}/pair{pair}/pair.json",
            dataset="results/{experiment}/crosscheck/{arm}/pair{pair}/dataset.json",
            ours_metrics="results/{experiment}/crosscheck/{arm}/pair{pair}/ours/metrics.json",
            ours_requests="results/{experiment}/crosscheck/{arm}/pair{pair}/ours/requests.jsonl",
            ours_monitors="results/{experiment}/crosscheck/{arm}/pair{pair}/ours/monitors.json",
            ours_provenance="results/{experiment}/crosscheck/{arm}/pair{pair}/ours/provenance.json",
            ours_server_log="results/{experiment}/crosscheck/{arm}/pair{pair}/ours/server.log",
            theirs_metrics="results/{experiment}/crosscheck/{arm}/pair{pair}/bench_serving/metrics.json",
            theirs_result="results/{experiment}/crosscheck/{arm}/pair{pair}/bench_serving/bench_serving.json",
            theirs_console="results/{experiment}/crosscheck/{arm}/pair{pair}/bench_serving/bench_serving.log",
            theirs_monitors="results/{experiment}/crosscheck/{arm}/pair{pair}/bench_serving/monitors.json",
            theirs_provenance="results/{experiment}/crosscheck/{arm}/pair{pair}/bench_serving/provenance.json",
            theirs_server_log="results/{experiment}/crosscheck/{arm}/pair{pair}/bench_serving/server.log",
        log:
            "results/logs/crosscheck_pair/{experiment}/{arm}/pair{pair}.log",
        wildcard_constraints:
            arm=re.escape(CROSSCHECK.arm),
            pair=r"[1-9][0-9]*",
        conda:
            "../envs/workflow.yaml"
        threads: WHOLE_HOST
        params:
            arm=CROSSCHECK_ARM.as_config(),
            client=CLIENT.as_config(),
            monitors=MONITORS.as_config(),
        script:
            "../scripts/crosscheck_pair.py"

    rule crosscheck_table:
        input:
            pairs=[
                f"{CROSSCHECK_DIRECTORY}/pair{pair}/{name}"
                for pair in range(1, CROSSCHECK.pairs + 1)
                for name in (
                    "pair.json",
                    "ours/metrics.json",
                    "bench_serving/metrics.json",
                )
            ],
        output:
            summary="results/{experiment}/tables/client_crosscheck.csv",
            runs="results/{experiment}/tables/client_crosscheck_runs.csv",
        log:
            "results/logs/crosscheck_table/{experiment}.log",
        localrule: True
        conda:
            "../envs/workflow.yaml"
        params:
            crosscheck=CROSSCHECK.as_config(),
        script:
            "../scripts/crosscheck_table.py"

    rule client_crosscheck:
        input:
            crosscheck_table_files(),
        localrule: True
