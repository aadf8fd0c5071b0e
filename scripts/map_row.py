"""Snakemake shim: one row of the thread x quota map on one fresh server."""

import json
import logging
import sys
from pathlib import Path

from serving_study.studies.thread_quota_map import run_map_row

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(
    stream=sys.stderr,
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(message)s",
)

cells = run_map_row(
    experiment=snakemake.wildcards.experiment,
    settings=dict(snakemake.params.settings),
    variant_name=snakemake.wildcards.variant,
    threads=int(snakemake.wildcards.threads),
    variant=json.loads(Path(snakemake.input.variant).read_text()),
    workload_manifest=Path(snakemake.input.workload),
    engine=dict(snakemake.params.engine),
    client=dict(snakemake.params.client),
    monitors=dict(snakemake.params.monitors),
    cells_dir=Path(snakemake.output.cells),
)
Path(snakemake.output.row).write_text(json.dumps(cells, indent=2, default=str) + "\n")
