"""Snakemake shim: write one arm's launch plan, the value its runs start as it is."""

import json
import logging
import sys
from pathlib import Path

from serving_study.config.records import Arm, ServerSettings, Variant
from serving_study.files import write_json
from serving_study.launch.engines import launch_plan
from serving_study.servers.container_commands import container_name, run_command

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")


def read_json(path: str) -> dict:
    return json.loads(Path(path).read_text())


inputs, params = snakemake.input, snakemake.params
experiment, arm = snakemake.wildcards.experiment, Arm.from_config(snakemake.params.arm)
server = ServerSettings.from_config(
    params.server,
    # The variant's image, the model snapshot the model rule checked (or
    # downloaded, or wrote) and the SGLang runtime the workflow built for this
    # host, each when the arm needs one.
    image_id_file=inputs.image or None,
    model_snapshot=read_json(inputs.model[0]) if inputs.model else None,
    runtime_record=read_json(inputs.runtime[0]) if inputs.runtime else None,
)
plan = launch_plan(
    server,
    arm,
    Variant.from_identity(read_json(inputs.variant)),
    Path(inputs.workload),
    port=params.port,
)
record = {"experiment": experiment, "arm": arm.name, "launch": plan.record()}
if plan.in_container:
    # As a run's would read, but for its name and labels (the run's own).
    name = f"{experiment}-{arm.name}"
    record["runtime_argv"] = run_command(plan, container_name(name), name)
write_json(Path(snakemake.output.plan), record)
logging.info("%s", " ".join(record.get("runtime_argv") or plan.command()))
