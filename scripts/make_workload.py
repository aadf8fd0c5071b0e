"""Snakemake shim: generate one seeded workload (images, prompt, manifest)."""

import logging
import shutil
import sys
import tempfile
from pathlib import Path

from serving_study.workloads import generate_workload

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

manifest_path = Path(snakemake.output.manifest)
images_path = Path(snakemake.output.images)
# Generate beside the outputs, then move into place, manifest last: an interrupted
# job never leaves a manifest that names missing images.
with tempfile.TemporaryDirectory(dir=manifest_path.parent) as scratch:
    generated = Path(scratch) / "workload"
    generate_workload(dict(snakemake.params.spec), generated)
    shutil.move(generated / "images", images_path)
    shutil.move(generated / "manifest.json", manifest_path)
