"""Snakemake shim: write one arm's SGLang server, container and environment."""

import logging
import sys
from pathlib import Path

from serving_study.config.platform import platform_for
from serving_study.servers.sglang_commands import arm_launch_commands, model_flags
from serving_study.sources.files import write_json
from serving_study.sources.model_snapshot import model_host_path

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")

if snakemake.params.engine != "sglang":
    raise SystemExit(
        f"launch commands are for engine 'sglang'; this experiment's engine is "
        f"{snakemake.params.engine!r} (run it with: snakemake --cores 1 all)"
    )
sglang = dict(snakemake.params.sglang)
tiny_model = snakemake.params.tiny_model_directory
commands = arm_launch_commands(
    experiment=snakemake.wildcards.experiment,
    arm=dict(snakemake.params.arm),
    sglang_settings=sglang,
    runtime=snakemake.params.runtime,
    model_host_path=str(
        Path(tiny_model).resolve()
        if tiny_model
        else model_host_path(sglang, Path(snakemake.params.model_download_directory))
    ),
    quota_during_startup=snakemake.params.quota_during_startup,
    platform=platform_for(snakemake.params.device),
    flags_of_model=model_flags(
        "dummy" if tiny_model else None,
        sglang["tiny_model"]["dtype"] if tiny_model else None,
    ),
)
write_json(Path(snakemake.output.commands), commands)
logging.info("%s", " ".join(commands["container_argv"] or commands["server_argv"]))
