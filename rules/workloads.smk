# Seeded workloads: the images and prompt every arm replays, written once and never
# inside a timed loop. The same seed gives byte-identical files on any host.


rule make_workload:
    output:
        manifest="results/{experiment}/workloads/{workload}/manifest.json",
        images=directory("results/{experiment}/workloads/{workload}/images"),
    log:
        "results/logs/make_workload/{experiment}/{workload}.log",
    benchmark:
        "results/benchmarks/jobs/make_workload/{experiment}/{workload}.tsv"
    priority: PREPARATION_PRIORITY
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        spec=lambda wildcards: WORKLOADS[wildcards.workload].as_config(),
    script:
        "../scripts/make_workload.py"
