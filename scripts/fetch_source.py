"""Snakemake shim: fetch one pinned engine source and record its identity."""

import json
import logging
import sys
from pathlib import Path

from serving_study.sources.fetch import fetch_source

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

# Archives are kept in resources/downloads, so a rerun or another source with the
# same release needs no network.
identity = fetch_source(
    snakemake.params.record,
    Path(snakemake.output.tree),
    download_dir=Path(snakemake.params.download_dir),
)
Path(snakemake.output.identity).write_text(json.dumps(identity, indent=2) + "\n")
