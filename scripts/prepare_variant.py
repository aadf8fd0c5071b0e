"""Snakemake shim: lay out one variant (source + optional patch), write its identity."""

import json
import logging
import sys
from pathlib import Path

from serving_study.sources.variants import prepare_variant

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

source_identity_path = Path(snakemake.input.source)
patch = Path(snakemake.input.patch[0]) if snakemake.input.patch else None
identity = prepare_variant(
    snakemake.params.record,
    source_tree=source_identity_path.parent / "tree",
    source_identity=json.loads(source_identity_path.read_text()),
    patch_path=patch,
    dest=Path(snakemake.output.tree),
    compile_bytecode=snakemake.params.compile_bytecode,
)
Path(snakemake.output.identity).write_text(json.dumps(identity, indent=2) + "\n")
