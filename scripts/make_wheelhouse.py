"""Snakemake shim: download an image's wheels (open requirements or a closed lock)
for offline installation."""

import logging
import sys
from pathlib import Path

from serving_study.sources.wheelhouse import make_wheelhouse

sys.stderr = open(snakemake.log.messages, "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

manifest = make_wheelhouse(
    Path(snakemake.input.requirements),
    Path(snakemake.output.wheelhouse),
    python_version=snakemake.params.python_version,
    glibc_version=snakemake.params.glibc_version,
    log_path=Path(snakemake.log.pip),
    closed=snakemake.params.closed,
)
logging.info(
    "%d wheels, %.0f MiB",
    len(manifest["wheels"]),
    sum(wheel["bytes"] for wheel in manifest["wheels"]) / 2**20,
)
