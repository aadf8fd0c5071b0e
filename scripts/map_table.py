"""Snakemake shim: every cell of the thread x quota map as one CSV table, the
variant contrast paired within blocks as another, and that contrast per quota as a
third."""

import json
import logging
import sys
from pathlib import Path

from serving_study.analysis.map_contrast import contrast_by_quota, map_contrast
from serving_study.studies.thread_quota_map import map_table

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

blocks = [json.loads(Path(path).read_text()) for path in snakemake.input.blocks]
cells = map_table(blocks)
cells.to_csv(snakemake.output.table, index=False)
contrast = map_contrast(cells, list(snakemake.params.variants))
contrast.to_csv(snakemake.output.contrast, index=False)
contrast_by_quota(contrast).to_csv(snakemake.output.by_quota, index=False)
