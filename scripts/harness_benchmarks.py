"""Snakemake shim: measure the harness itself and write its figures as JSON."""

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
from serving_study.studies.harness.benchmark_run import run_benchmarks

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(
    stream=sys.stderr,
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(message)s",
)

identities = [json.loads(Path(path).read_text()) for path in snakemake.input.variants]
settings = dict(snakemake.params.settings)
settings["workload_manifest"] = snakemake.input.workload
settings["study_job_benchmarks"] = list(snakemake.input.study_jobs)
settings["study_run_directories"] = [
    str(Path(provenance).parent) for provenance in snakemake.input.study_runs
]
settings["variant_roots"] = {
    identity["name"]: identity["sglang_python_root"] for identity in identities
}
figures = run_benchmarks(
    settings,
    Path(snakemake.output.details),
    arm=Arm.from_config(snakemake.params.arm),
    variant=Variant.from_identity(
        json.loads(Path(snakemake.input.arm_variant).read_text())
    ),
    server_settings=ServerSettings.from_config(snakemake.params.server),
    client=ClientSettings.from_config(snakemake.params.client),
    monitors=MonitorSettings.from_config(snakemake.params.monitors),
    sharing=HostSharing.from_config(snakemake.config["host_sharing"]),
)
Path(snakemake.output.figures).write_text(json.dumps(figures, indent=2) + "\n")
