"""Snakemake shim: run one (arm, run) on a fresh server and write its results,
keeping every earlier attempt (run_attempts.py)."""

import json
import logging
import sys
from pathlib import Path

from serving_study.config.content_keys import canonical_sha256
from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    Variant,
)
from serving_study.launch.plan import LaunchPlan
from serving_study.measure.arm_runner import run_arm
from serving_study.measure.run_attempts import RunAttempts, measure_attempt
from serving_study.measure.run_outputs import RunPaths
from serving_study.measure.run_provenance import run_provenance
from serving_study.servers.parent_death import terminated_with_parent

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
arm = Arm.from_config(params.arm)
run = int(wildcards.run)
plan_record = read_json(inputs.plan)["launch"]
# What this run measures: an earlier attempt is given back only when it is the same.
settings_sha256 = canonical_sha256(
    {
        "params": {name: params[name] for name in ("arm", "client", "monitors")},
        "launch": plan_record,
        "variant": identity,
        "workload": Path(inputs.workload).read_text(),
    }
)
attempts = RunAttempts(
    root=Path(params.attempts),
    outputs=RunPaths(
        metrics=Path(snakemake.output.metrics),
        requests=Path(snakemake.output.requests),
        monitors=Path(snakemake.output.monitors),
        provenance=Path(snakemake.output.provenance),
        server_log=Path(snakemake.output.server_log),
    ),
    listing=Path(snakemake.output.attempts),
    settings_sha256=settings_sha256,
)
traced_to = run_provenance(snakemake.config, read_json(inputs.host), identity)
# From the config, not a param: how runs share the host re-measures no run.
sharing = HostSharing.from_config(snakemake.config["host_sharing"])
measure_attempt(
    attempts,
    sharing,
    holder=f"experiment {wildcards.experiment}, arm {arm.name}, run {run}",
    measure=lambda paths, lock: run_arm(
        experiment=wildcards.experiment,
        arm=arm,
        run=run,
        variant=Variant.from_identity(identity),
        workload_manifest=Path(inputs.workload),
        plan=LaunchPlan.from_record(plan_record),
        client=ClientSettings.from_config(params.client),
        monitors=MonitorSettings.from_config(params.monitors),
        sharing=sharing,
        traced_to={**traced_to, "settings_sha256": settings_sha256},
        paths=paths,
        lock=lock,
    ),
)
