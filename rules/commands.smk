# The exact command lines of every real SGLang arm (engine sglang), written without a
# GPU: the server's argv with transport, caches and memory spelled out, the container
# argv that runs it with the model mounted, and the environment it gets. The arm
# runner starts servers with the same functions; these files let a reader check them.


rule launch_commands:
    output:
        commands="results/{experiment}/commands/{arm}.json",
    log:
        "results/logs/launch_commands/{experiment}/{arm}.log",
    localrule: True
    conda:
        "../envs/workflow.yaml"
    params:
        engine=SERVER.engine,
        runtime=SERVER.runtime,
        device=SERVER.device,
        arm=arm_settings,
        # What a server reads of the sglang section, its port, and the model.
        sglang={
            **(SERVER.sglang or {}),
            "port": config["sglang"]["port"],
            **model_source(config["sglang"]),
        },
        model_download_directory=model_download_directory(),
        tiny_model_directory=tiny_model_directory(),
        tiny_model_dtype=TINY_MODEL.dtype if TINY_MODEL else None,
        quota_during_startup=CLIENT.quota_during_startup,
    script:
        "../scripts/launch_commands.py"


rule commands:
    input:
        launch_commands_files(),
