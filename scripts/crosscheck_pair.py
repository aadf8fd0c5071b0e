"""Snakemake shim: one pair of the client cross-check, our client's run and
bench_serving's, each on a fresh server of the arm."""

import json
import logging
import sys
from pathlib import Path

from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    Variant,
)
from serving_study.launch.plan import LaunchPlan
from serving_study.measure.run_provenance import run_provenance
from serving_study.servers.parent_death import terminated_with_parent
from serving_study.studies.bench_serving_run import BenchServing
from serving_study.studies.client_crosscheck import PairPaths, measure_pair

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(
    stream=sys.stderr,
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(message)s",
)
# Snakemake killed outright leaves no job behind: the runner tears its server down.
terminated_with_parent()


def read_json(path: str) -> dict:
    return json.loads(Path(path).read_text())


inputs, params, wildcards = snakemake.input, snakemake.params, snakemake.wildcards
identity = read_json(inputs.variant)
bench = BenchServing(
    python=read_json(inputs.runtime)["python"],
    sglang_python_root=str((Path(inputs.release_tree) / "python").resolve()),
    tokenizer=read_json(inputs.tokenizer)["path"],
)
measure_pair(
    experiment=wildcards.experiment,
    arm=Arm.from_config(params.arm),
    pair=int(wildcards.pair),
    plan=LaunchPlan.from_record(read_json(inputs.plan)["launch"]),
    variant=Variant.from_identity(identity),
    workload_manifest=Path(inputs.workload),
    bench=bench,
    client=ClientSettings.from_config(params.client),
    monitors=MonitorSettings.from_config(params.monitors),
    # From the config, not a param: how runs share the host re-measures nothing.
    sharing=HostSharing.from_config(snakemake.config["host_sharing"]),
    paths=PairPaths.in_directory(Path(snakemake.output.record).parent),
    traced_to=run_provenance(snakemake.config, read_json(inputs.host), identity),
)
