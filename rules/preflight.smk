# Preflight, in two steps. The host's: remove what dead runs left (under the host's
# measurement lock), describe the host (CPUs, quota, GPU, runtimes, free /dev/shm)
# and stop early when the engine needs what the host lacks. Each arm's: the intra-op
# threads its server will start, the study's trap and the doctor's prescription, and
# what the arm needs of the host.
#
# Every run depends on both, and a preflight that is redone re-measures what depends
# on it: so the host's step reads nothing an arm or a published page can change, and
# an arm's step only its own arm. Neither is a local rule: on a cluster the host that
# matters is the node the arms run on, whose GPU and visible CPUs a login node does
# not share, so profiles/slurm gives them the same SLURM request as run_arm.

ENGINE_FACTS = {
    "engine": SERVER.engine,
    "runtime": SERVER.runtime,
    "sglang_device": SERVER.device,
}


rule preflight:
    output:
        host="results/{experiment}/host.json",
    log:
        "results/logs/preflight/{experiment}.log",
    benchmark:
        "results/benchmarks/jobs/preflight/{experiment}.tsv"
    priority: PREPARATION_PRIORITY
    conda:
        "../envs/workflow.yaml"
    params:
        engine=ENGINE_FACTS,
    script:
        "../scripts/preflight.py"


rule arm_preflight:
    input:
        host="results/{experiment}/host.json",
        # What the project measured of each fix, for the doctor's prescription:
        # advice, so a newer or added published table redoes no preflight (and no
        # run).
        published=ancient(published_results()),
    output:
        plan="results/{experiment}/preflight/{arm}.json",
    log:
        "results/logs/arm_preflight/{experiment}/{arm}.log",
    benchmark:
        "results/benchmarks/jobs/arm_preflight/{experiment}/{arm}.tsv"
    priority: PREPARATION_PRIORITY
    conda:
        "../envs/workflow.yaml"
    params:
        engine=ENGINE_FACTS,
        arm=arm_settings,
        workload=lambda wildcards: WORKLOADS[ARMS[wildcards.arm].workload].as_config(),
    script:
        "../scripts/arm_preflight.py"


# On demand (snakemake --cores 1 cleanup): what dead runs left, removed now.
rule cleanup:
    log:
        "results/logs/cleanup.log",
    localrule: True
    conda:
        "../envs/workflow.yaml"
    script:
        "../scripts/cleanup.py"
