"""Snakemake shim: two results folders side by side, as tables and one page."""

import logging
import sys
from pathlib import Path

from serving_study.analysis.comparison import ComparedFolders, comparison_tables
from serving_study.analysis.release_change import ChangeCriterion
from serving_study.report.comparison_page import comparison_page

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

folders = ComparedFolders.from_config(snakemake.params.folders)
criterion = ChangeCriterion.from_config(snakemake.params.criterion)
tables = comparison_tables(folders, criterion)
for name in ("arms", "claims", "hosts"):
    tables[name].to_csv(snakemake.output[name], index=False)
page = comparison_page(tables, criterion)
Path(snakemake.output.html).write_text(page, encoding="utf-8")
