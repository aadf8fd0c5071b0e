"""Snakemake shim: lay out one variant (source + optional patch), write its identity."""

import json
import logging
import sys
from contextlib import nullcontext
from pathlib import Path

from serving_study.config.records import HostSharing
from serving_study.measure.host_sharing import preparation_lock
from serving_study.sources.variants import prepare_variant

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

source_identity_path = Path(snakemake.input.source)
patch = Path(snakemake.input.patch[0]) if snakemake.input.patch else None
compile_bytecode = snakemake.params.compile_bytecode
# From the config, not a param: how pipelines share the host re-runs no job.
sharing = HostSharing.from_config(snakemake.config["host_sharing"])
# Compiling the tree's bytecode takes every CPU; copying it is light.
with (
    preparation_lock(sharing, f"prepare_variant of {snakemake.output.identity}")
    if compile_bytecode
    else nullcontext()
):
    identity = prepare_variant(
        snakemake.params.record,
        source_tree=Path(snakemake.input.source_tree),
        source_identity=json.loads(source_identity_path.read_text()),
        patch_path=patch,
        dest=Path(snakemake.output.tree),
        compile_bytecode=compile_bytecode,
    )
Path(snakemake.output.identity).write_text(json.dumps(identity, indent=2) + "\n")
