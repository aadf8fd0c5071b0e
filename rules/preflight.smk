# Preflight: describe the host (CPUs, quota, intra-op threads, GPU, runtimes, free
# /dev/shm) and stop early when the experiment needs what the host lacks.


rule preflight:
    output:
        host="results/{experiment}/host.json",
    log:
        "results/logs/preflight/{experiment}.log",
    conda:
        "../envs/workflow.yaml"
    params:
        engine=engine_settings(),
        arms=config["arms"],
        workloads=config["workloads"],
        monitors=config["monitors"],
    script:
        "../scripts/preflight.py"
