# The model a real SGLang server loads: the local snapshot config names, checked, or
# the Hub model at its pinned commit, downloaded once into resources/models/. The
# record lists the sha256 of every file, so each run can name the weights it served.


rule model:
    output:
        snapshot="resources/models/{model}/snapshot.json",
    log:
        "results/logs/model/{model}.log",
    benchmark:
        "results/benchmarks/jobs/model/{model}.tsv"
    priority: PREPARATION_PRIORITY
    retries: 1
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        sglang=model_source(config["sglang"]),
        download_directory=lambda wildcards, output: Path(output.snapshot).with_name(
            "snapshot"
        ),
    script:
        "../scripts/model_snapshot.py"


# A seeded tiny Qwen3-VL (config sglang.tiny_model): config, tokenizer, chat template
# and processor configs, no weight files (the server loads dummy weights). The same
# settings write the same bytes; the record lists each file's sha256.
rule tiny_model:
    output:
        snapshot="resources/tiny-models/{model}/snapshot.json",
        model=directory("resources/tiny-models/{model}/model"),
    log:
        "results/logs/tiny_model/{model}.log",
    benchmark:
        "results/benchmarks/jobs/tiny_model/{model}.tsv"
    priority: PREPARATION_PRIORITY
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        settings=config["sglang"].get("tiny_model", {}),
    script:
        "../scripts/tiny_model.py"


# The experiment's model by name (its folder holds its source's hash): the real
# model checked or downloaded, or the tiny model written.
rule pinned_model:
    input:
        model_snapshot_file(),
    localrule: True
