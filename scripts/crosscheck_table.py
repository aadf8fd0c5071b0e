"""Snakemake shim: the client cross-check's tables, every run and the verdict."""

import logging
import sys
from pathlib import Path

from serving_study.analysis.crosscheck_table import (
    RUNS_TABLE,
    SUMMARY_TABLE,
    write_tables,
)
from serving_study.config.crosscheck_settings import ClientCrosscheck

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

pairs = sorted(
    {
        Path(path).parent
        for path in snakemake.input.pairs
        if Path(path).name == "pair.json"
    }
)
written = write_tables(
    pairs,
    ClientCrosscheck.from_config(snakemake.params.crosscheck),
    Path(snakemake.output.summary).parent,
)
assert written[SUMMARY_TABLE] == Path(snakemake.output.summary)
assert written[RUNS_TABLE] == Path(snakemake.output.runs)
