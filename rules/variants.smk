# Engine sources and variants: a pinned SGLang source (PyPI release, git commit or
# local copy), and per variant that source with an optional patch applied. Each
# variant's identity (source hash or commit, patch hash, patched mm_utils.py hash)
# is written to results/<experiment>/variants/<variant>.json. Sources are shared by
# the experiments that pin them alike (resources/sources/<name>-<record hash>/).


rule fetch_source:
    output:
        identity="resources/sources/{source}/identity.json",
        tree=directory("resources/sources/{source}/tree"),
    log:
        "results/logs/fetch_source/{source}.log",
    benchmark:
        "results/benchmarks/jobs/fetch_source/{source}.tsv"
    priority: PREPARATION_PRIORITY
    retries: 1
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        record=lambda wildcards: SOURCE_RECORDS[wildcards.source],
        download_dir="resources/downloads",
    script:
        "../scripts/fetch_source.py"


rule prepare_variant:
    input:
        unpack(source_of_variant),
        patch=patch_of_variant,
    output:
        identity="results/{experiment}/variants/{variant}.json",
        tree=directory("results/{experiment}/variants/{variant}/source"),
    log:
        "results/logs/prepare_variant/{experiment}/{variant}.log",
    benchmark:
        "results/benchmarks/jobs/prepare_variant/{experiment}/{variant}.tsv"
    priority: PREPARATION_PRIORITY
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        record=variant_record,
        # A real server imports the whole tree at each start (variants.py).
        compile_bytecode=config["engine"] == "sglang",
    script:
        "../scripts/prepare_variant.py"
