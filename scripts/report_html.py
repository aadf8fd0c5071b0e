"""Snakemake shim: render the experiment's self-contained HTML report."""

import json
import logging
import sys
from pathlib import Path

from serving_study.analysis.aggregate import read_tables
from serving_study.analysis.run_timelines import run_timelines
from serving_study.report.page import build_report
from serving_study.report.settings import ReportSettings

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

settings = ReportSettings.from_config(snakemake.params.config)
tables = read_tables(Path(snakemake.input.tables[0]).parent)
tables |= run_timelines(
    tables["runs"],
    settings.arm_names,
    snakemake.input.requests,
    snakemake.input.monitors,
)
build_report(
    tables,
    settings=settings,
    host=json.loads(Path(snakemake.input.host).read_text()),
    variants=[json.loads(Path(path).read_text()) for path in snakemake.input.variants],
    out_html=Path(snakemake.output.html),
    figures_dir=Path(snakemake.output.figure_1).parent,
)
