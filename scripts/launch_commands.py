"""Snakemake shim: write one arm's SGLang server, container and environment."""

import logging
import sys
from pathlib import Path

from serving_study.config.platform import platform_for
from serving_study.config.records import Arm
from serving_study.files import write_json
from serving_study.servers.sglang_commands import arm_launch_commands, model_flags
from serving_study.sources.model_snapshot import model_host_path

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")

params = snakemake.params
if params.engine != "sglang":
    raise SystemExit(
        f"launch commands are for engine 'sglang'; this experiment's engine is "
        f"{params.engine!r} (run it with: snakemake --cores 1 all)"
    )
sglang = dict(params.sglang)
tiny_model = params.tiny_model_directory
commands = arm_launch_commands(
    experiment=snakemake.wildcards.experiment,
    arm=Arm.from_config(params.arm),
    sglang_settings=sglang,
    runtime=params.runtime,
    model_host_path=str(
        Path(tiny_model).resolve()
        if tiny_model
        else model_host_path(sglang, Path(params.model_download_directory))
    ),
    quota_during_startup=params.quota_during_startup,
    platform=platform_for(params.device),
    flags_of_model=model_flags(
        "dummy" if tiny_model else None, params.tiny_model_dtype
    ),
)
write_json(Path(snakemake.output.commands), commands)
logging.info("%s", " ".join(commands["container_argv"] or commands["server_argv"]))
