# Preflight: remove what dead runs left (under the host's measurement lock), describe
# the host (CPUs, quota, intra-op threads, GPU, runtimes, free /dev/shm) and stop
# early when the experiment needs what the host lacks.
# Not a local rule: on a cluster the host that matters is the node the arms run on,
# whose GPU and visible CPUs a login node does not share, so profiles/slurm gives
# the preflight the same SLURM request as run_arm.


rule preflight:
    input:
        # What the project measured of each fix, for the doctor's prescription.
        fixes_tables=published_fixes_tables(),
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
        engine={
            "engine": SERVER.engine,
            "runtime": SERVER.runtime,
            "sglang_device": SERVER.device,
        },
        arms=[arm.as_config() for arm in ARMS.values()],
        workloads=[workload.as_config() for workload in WORKLOADS.values()],
        sharing=HOST_SHARING.as_config(),
    script:
        "../scripts/preflight.py"
