# Benchmarks of the harness itself, never part of `all`: the client's highest request
# rate and TTFT overhead against a server that does no work, a lagging client making
# a run invalid, the monitors' CPU, one real arm's wall time beyond its measured
# window, each variant's shared-memory copy beside memcpy, and the default study's
# wall time (from its jobs' benchmark files: the study runs first where it has not).
# `snakemake --cores 1 harness_benchmarks` measures once (a few minutes, the whole
# host) and prints the figures; `--forcerun measure_harness` measures again.

# The arm and workload the benchmarks use: the config's first arm (in the default
# config, arm A on the 512 px workload).
BENCHMARK_ARM = next(iter(ARMS.values()))
# The study's highest throughput (STUDY.md, P4: cuda_ipc at concurrency 16): the
# rate the client must exceed many times over.
STUDY_PEAK_RPS = 25.7
# The benchmark file of every job of the study (`all`) but its runs: their seconds
# and the runs' own wall times add up to its wall time. A run_arm job has no
# benchmark: Snakemake would sample its server's processes during the measurement.
STUDY_JOB_BENCHMARKS = [
    *(f"results/benchmarks/jobs/fetch_source/{key}.tsv" for key in SOURCE_RECORDS),
    *(
        f"results/benchmarks/jobs/prepare_variant/{EXPERIMENT}/{name}.tsv"
        for name in VARIANTS
    ),
    *(
        f"results/benchmarks/jobs/make_workload/{EXPERIMENT}/{name}.tsv"
        for name in WORKLOADS
    ),
    *(
        f"results/benchmarks/jobs/{rule}/{EXPERIMENT}.tsv"
        for rule in ("preflight", "aggregate", "report_html")
    ),
    *(f"results/benchmarks/jobs/arm_preflight/{EXPERIMENT}/{arm}.tsv" for arm in ARMS),
]


rule measure_harness:
    input:
        workload=workload_file(BENCHMARK_ARM.workload),
        arm_variant=variant_file(BENCHMARK_ARM.variant),
        variants=variant_identity_files(),
        study_jobs=STUDY_JOB_BENCHMARKS,
        # Each run's wall time and, beside it, its measured window.
        study_runs=[
            f"{run_directory(arm, run)}/provenance.json" for arm, run in arm_runs()
        ],
        study_run_metrics=run_metrics_files(),
    output:
        figures="results/benchmarks/harness.json",
        details=directory("results/benchmarks/harness"),
    log:
        "results/logs/benchmarks/measure_harness.log",
    conda:
        "../envs/workflow.yaml"
    threads: WHOLE_HOST
    params:
        settings={
            "study_peak_rps": STUDY_PEAK_RPS,
            "client_concurrencies": [16, 64, 128],
            "client_measured_requests": 4000,
            "ttft_requests_per_round": 50,
            "ttft_rounds": 8,
            "dispatch_block_s": 0.3,
            "monitor_window_s": 60,
            "monitor_tree_threads": 128,
            "shm_columns": 1536,
            # Rows of Qwen3-VL's pixel values for one image (16 px patches, 2 frames).
            "shm_rows_per_image_size": {"512": 1024, "1024": 4096, "2048": 16384},
            "shm_repeats": 15,
        },
        arm=BENCHMARK_ARM.as_config(),
        server=SERVER.as_config(),
        client=CLIENT.as_config(),
        monitors=MONITORS.as_config(),
    script:
        "../scripts/harness_benchmarks.py"


rule harness_benchmarks:
    input:
        rules.measure_harness.output.figures,
    log:
        "results/logs/benchmarks/harness_benchmarks.log",
    localrule: True
    conda:
        "../envs/workflow.yaml"
    shell:
        "cat {input} 2> {log}"


# The real server's own figures (engine sglang on CPU), from a finished study: start
# to healthy, each arm's overhead, and the main process's CPU per image request
# split into the image processor, the SHM copy and the rest (the two steps measured
# again, alone, in the server's runtime with the arm's variant and threads).
# `snakemake --cores 1 real_server_benchmarks --configfile config/sglang-cpu.yaml`.
rule real_server_benchmarks:
    input:
        metrics=run_metrics_files(),
        variants=variant_identity_files(),
        runtime=SGLANG_RUNTIME,
        model=model_snapshot_file(),
        workloads=[workload_file(name) for name in WORKLOADS],
    output:
        figures=f"results/{EXPERIMENT}/real_server.json",
        table=f"results/{EXPERIMENT}/tables/real_server.csv",
    log:
        f"results/logs/benchmarks/real_server_{EXPERIMENT}.log",
    # It measures in the runtime the workflow built on this host.
    localrule: True
    conda:
        "../envs/workflow.yaml"
    threads: WHOLE_HOST
    params:
        arms=[arm.as_config() for arm in ARMS.values()],
        images=24,
    script:
        "../scripts/real_server_benchmarks.py"
