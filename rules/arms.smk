# One job per (arm, run): a fresh server under the arm's CPU quota, warm-up, the
# measured window with monitors, teardown, and the run's metrics. Jobs run in seeded
# shuffled blocks (run 1's arms, then run 2's, ...), and each takes the whole host so
# that no other job disturbs a measurement.
#
# A run starts its arm's launch plan (rules/commands.smk) as it is, on a free port.
# It re-measures only when its own inputs change: its plan, arm, variant, workload,
# or the host's description (rules/preflight.smk keeps edits to
# other arms and published pages out of that). The host-sharing settings are read
# from the config by the runner, not given as params: how runs share a host never
# changes what a run measures. (No input here is ancient(): when an ancient input's
# job reruns, Snakemake 9.27 no longer looks at what depends on it for its own
# reasons, and an added arm's runs would go unplanned.)
#
# A re-measure never destroys a valid run: each attempt writes into a folder of its
# own under results/<experiment>/attempts/, and the run's outputs are copies of the
# attempt that counts (measure/run_attempts.py says which).


rule run_arm:
    input:
        # How the server starts (rules/commands.smk), run as it is.
        plan=launch_plan_of_arm,
        variant=variant_of_arm,
        workload=workload_of_arm,
        host="results/{experiment}/host.json",
        preflight="results/{experiment}/preflight/{arm}.json",
        image=image_of_arm,
        model=model_of_engine,
        runtime=sglang_runtime_of_engine,
        patch=patch_of_arm,
    output:
        metrics="results/{experiment}/{arm}/run{run}/metrics.json",
        requests="results/{experiment}/{arm}/run{run}/requests.jsonl",
        monitors="results/{experiment}/{arm}/run{run}/monitors.json",
        provenance="results/{experiment}/{arm}/run{run}/provenance.json",
        server_log="results/{experiment}/{arm}/run{run}/server.log",
        # Every attempt at the run, the superseded and failed ones included.
        attempts="results/{experiment}/{arm}/run{run}/attempts.json",
    log:
        "results/logs/run_arm/{experiment}/{arm}/run{run}.log",
    priority: arm_run_priority
    conda:
        "../envs/workflow.yaml"
    threads: WHOLE_HOST
    params:
        arm=arm_settings,
        client=CLIENT.as_config(),
        monitors=MONITORS.as_config(),
        # Where every attempt is kept, outside the outputs Snakemake deletes.
        attempts="results/{experiment}/attempts/{arm}/run{run}",
    script:
        "../scripts/run_arm.py"
