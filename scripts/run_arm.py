"""Snakemake shim: run one (arm, run) on a fresh server and write its results."""

import json
import logging
import sys
from pathlib import Path

from serving_study.measure.arm_runner import run_arm
from serving_study.measure.host_sharing import HostSharing
from serving_study.measure.run_outputs import RunPaths
from serving_study.measure.run_provenance import run_provenance
from serving_study.servers.sglang_commands import model_flags

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(
    stream=sys.stderr,
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(message)s",
)

engine = dict(snakemake.params.engine)
if snakemake.input.model:
    # Where the model rule checked (or downloaded, or wrote) the snapshot here.
    snapshot = json.loads(Path(snakemake.input.model[0]).read_text())
    engine["model_host_path"] = snapshot["path"]
    engine["model_flags"] = model_flags(
        snapshot.get("load_format"), snapshot.get("settings", {}).get("dtype")
    )
if snakemake.input.runtime:
    # The SGLang server runtime the workflow built for this host's CPU.
    runtime = json.loads(Path(snakemake.input.runtime[0]).read_text())
    engine["runtime_python"] = runtime["python"]

variant = json.loads(Path(snakemake.input.variant).read_text())
traced_to = run_provenance(
    snakemake.config, json.loads(Path(snakemake.input.host).read_text()), variant
)

run_arm(
    experiment=snakemake.wildcards.experiment,
    arm=dict(snakemake.params.arm),
    run=int(snakemake.wildcards.run),
    variant=variant,
    workload_manifest=Path(snakemake.input.workload),
    engine=engine,
    client=dict(snakemake.params.client),
    monitors=dict(snakemake.params.monitors),
    sharing=HostSharing.from_config(dict(snakemake.params.sharing)),
    traced_to=traced_to,
    paths=RunPaths(
        metrics=Path(snakemake.output.metrics),
        requests=Path(snakemake.output.requests),
        monitors=Path(snakemake.output.monitors),
        provenance=Path(snakemake.output.provenance),
        server_log=Path(snakemake.output.server_log),
    ),
)
