"""Snakemake shim: run one (arm, run) on a fresh server and write its results."""

import json
import logging
import sys
from pathlib import Path

from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    ServerSettings,
    Variant,
)
from serving_study.measure.arm_runner import run_arm
from serving_study.measure.run_outputs import RunPaths
from serving_study.measure.run_provenance import run_provenance

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(
    stream=sys.stderr,
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(message)s",
)


def read_json(path: str) -> dict:
    return json.loads(Path(path).read_text())


inputs = snakemake.input
identity = read_json(inputs.variant)
run_arm(
    experiment=snakemake.wildcards.experiment,
    arm=Arm.from_config(snakemake.params.arm),
    run=int(snakemake.wildcards.run),
    variant=Variant.from_identity(identity),
    workload_manifest=Path(inputs.workload),
    server_settings=ServerSettings.from_config(
        snakemake.params.server,
        # The variant's image, the model snapshot the model rule checked (or
        # downloaded, or wrote) and the SGLang runtime built for this host's CPU,
        # each when the arm needs one.
        image_id_file=inputs.image or None,
        model_snapshot=read_json(inputs.model[0]) if inputs.model else None,
        runtime_python=read_json(inputs.runtime[0])["python"]
        if inputs.runtime
        else None,
    ),
    client=ClientSettings.from_config(snakemake.params.client),
    monitors=MonitorSettings.from_config(snakemake.params.monitors),
    # From the config, not a param: how runs share the host re-measures no run.
    sharing=HostSharing.from_config(snakemake.config["host_sharing"]),
    traced_to=run_provenance(snakemake.config, read_json(inputs.host), identity),
    paths=RunPaths(
        metrics=Path(snakemake.output.metrics),
        requests=Path(snakemake.output.requests),
        monitors=Path(snakemake.output.monitors),
        provenance=Path(snakemake.output.provenance),
        server_log=Path(snakemake.output.server_log),
    ),
)
