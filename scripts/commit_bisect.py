"""Snakemake shim: bisect two commits for the one that changed the arm's figure."""

import json
import logging
import sys
from pathlib import Path

from serving_study.analysis.release_change import ChangeCriterion
from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    ServerSettings,
)
from serving_study.studies.commit_bisect import ProbeSettings, run_commit_bisect

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(
    stream=sys.stderr,
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(message)s",
)

params = snakemake.params
result = run_commit_bisect(
    params.good,
    params.bad,
    ProbeSettings(
        experiment=snakemake.wildcards.experiment,
        repository=params.repository,
        arm=Arm.from_config(params.arm),
        runs=int(params.runs),
        workload_manifest=Path(snakemake.input.workload),
        server_settings=ServerSettings.from_config(params.server),
        client=ClientSettings.from_config(params.client),
        monitors=MonitorSettings.from_config(params.monitors),
        sharing=HostSharing.from_config(snakemake.config["host_sharing"]),
        criterion=ChangeCriterion.from_config(dict(params.criterion)),
        sources_dir=Path(params.sources_dir),
        probes_dir=Path(snakemake.output.probes),
        repeats=int(params.repeats),
        seed=int(params.seed),
    ),
)
Path(snakemake.output.result).write_text(json.dumps(result, indent=2) + "\n")
