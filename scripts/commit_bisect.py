"""Snakemake shim: bisect two commits for the one that changed the arm's figure."""

import json
import logging
import sys
from pathlib import Path

from serving_study.analysis.release_change import ChangeCriterion
from serving_study.studies.commit_bisect import ProbeSettings, run_commit_bisect

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(
    stream=sys.stderr,
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(message)s",
)

bisect = dict(snakemake.params.bisect)
result = run_commit_bisect(
    bisect["good"],
    bisect["bad"],
    ProbeSettings(
        experiment=snakemake.wildcards.experiment,
        repository=bisect["repository"],
        arm=dict(snakemake.params.arm),
        runs=int(bisect["runs"]),
        workload_manifest=Path(snakemake.input.workload),
        engine=dict(snakemake.params.engine),
        client=dict(snakemake.params.client),
        monitors=dict(snakemake.params.monitors),
        criterion=ChangeCriterion.from_config(dict(snakemake.params.criterion)),
        sources_dir=Path(snakemake.params.sources_dir),
        probes_dir=Path(snakemake.output.probes),
    ),
)
Path(snakemake.output.result).write_text(json.dumps(result, indent=2) + "\n")
