# Seeded workloads: the images and prompt every arm replays, written once and never
# inside a timed loop. The same seed gives byte-identical files on any host.


rule make_workload:
    output:
        manifest="results/workloads/{workload}/manifest.json",
        images=directory("results/workloads/{workload}/images"),
    log:
        "results/logs/make_workload/{workload}.log",
    benchmark:
        "results/benchmarks/jobs/make_workload/{workload}.tsv"
    priority: PREPARATION_PRIORITY
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        spec=lambda wildcards: WORKLOADS[wildcards.workload].as_config(),
    script:
        "../scripts/make_workload.py"
