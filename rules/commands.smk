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
        engine=config["engine"],
        runtime=config["runtime"],
        arm=lambda wildcards: ARMS[wildcards.arm],
        sglang=config["sglang"],
        device=SGLANG_PLATFORM.device if SGLANG_PLATFORM else None,
        model_download_directory=model_download_directory(),
        tiny_model_directory=tiny_model_directory(),
        quota_during_startup=config["client"]["quota_during_startup"],
    script:
        "../scripts/launch_commands.py"


rule commands:
    input:
        launch_commands_files(),
