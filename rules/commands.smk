# Each arm's launch plan: how its server starts, as one value (launch/plan.py). The
# runs start it as it is, with a free port each; a reader checks it here, and every
# run's provenance holds it as it ran.


rule launch_plan:
    input:
        variant=variant_of_arm,
        workload=workload_of_arm,
        image=image_of_arm,
        model=model_of_engine,
        runtime=sglang_runtime_of_engine,
        patch=patch_of_arm,
    output:
        plan="results/{experiment}/commands/{arm}.json",
    log:
        "results/logs/launch_plan/{experiment}/{arm}.log",
    priority: PREPARATION_PRIORITY
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        arm=arm_settings,
        server=SERVER.as_config(),
        # What the plan shows as its port; each run takes a free one instead.
        port=config["sglang"]["port"] if SERVER.engine == "sglang" else None,
    script:
        "../scripts/launch_plan.py"


rule commands:
    input:
        launch_plan_files(),
