"""Snakemake shim: per-run figures, medians of valid runs, ratios, claims and each
run's earlier attempts as CSV."""

import logging
import sys
from pathlib import Path

from serving_study.analysis.aggregate import aggregate, write_tables

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

tables = aggregate(
    [Path(path) for path in snakemake.input.metrics],
    snakemake.params.config,
    attempts_paths=[Path(path) for path in snakemake.input.attempts],
    provenance_paths=[Path(path) for path in snakemake.input.provenance],
)
write_tables(tables, Path(snakemake.output.arms).parent)
