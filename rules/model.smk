# The model a real SGLang server loads: the local snapshot config names, checked, or
# the Hub model at its pinned commit, downloaded once into resources/models/. The
# record lists the sha256 of every file, so each run can name the weights it served.


rule model:
    output:
        snapshot="resources/models/{model}/snapshot.json",
    log:
        "results/logs/model/{model}.log",
    retries: 1
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        sglang=config["sglang"],
        download_directory=lambda wildcards, output: Path(output.snapshot).with_name(
            "snapshot"
        ),
    script:
        "../scripts/model_snapshot.py"
