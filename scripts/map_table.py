"""Snakemake shim: every cell of the thread x quota map as one CSV table."""

import json
import logging
import sys
from pathlib import Path

from serving_study.studies.thread_quota_map import map_table

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

rows = [json.loads(Path(path).read_text()) for path in snakemake.input.rows]
map_table(rows).to_csv(snakemake.output.table, index=False)
