"""Snakemake shim: generate one seeded workload (images, prompt, manifest)."""

import logging
import shutil
import sys
import tempfile
from pathlib import Path

from serving_study.config.records import HostSharing
from serving_study.measure.host_sharing import preparation_lock
from serving_study.workloads import generate_workload

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

manifest_path = Path(snakemake.output.manifest)
images_path = Path(snakemake.output.images)
# From the config, not a param: how pipelines share the host re-runs no job.
sharing = HostSharing.from_config(snakemake.config["host_sharing"])
# Generate beside the outputs, then move into place, manifest last: an interrupted
# job never leaves a manifest that names missing images.
with (
    preparation_lock(sharing, f"make_workload of {manifest_path}"),
    tempfile.TemporaryDirectory(dir=manifest_path.parent) as scratch,
):
    generated = Path(scratch) / "workload"
    generate_workload(dict(snakemake.params.spec), generated)
    shutil.move(generated / "images", images_path)
    shutil.move(generated / "manifest.json", manifest_path)
