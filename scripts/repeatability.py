"""Snakemake shim: one results page's claims and claim arms in every session, and
the README section that shows them."""

import logging
import sys
from pathlib import Path

from serving_study.analysis.repeatability import repeatability_tables
from serving_study.analysis.repeatability_text import section

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

claims, arms = repeatability_tables(Path(snakemake.params.page))
claims.to_csv(snakemake.output.claims, index=False)
arms.to_csv(snakemake.output.arms, index=False)
Path(snakemake.output.section).write_text(section(claims, arms), encoding="utf-8")
