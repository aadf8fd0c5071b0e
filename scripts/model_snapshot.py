"""Snakemake shim: check or download the model snapshot and record its files."""

import logging
import sys
from pathlib import Path

from serving_study.files import write_json
from serving_study.sources.model_snapshot import ModelUnavailable, ensure_model_snapshot
from serving_study.sources.recorded_files import RecordedFileChanged

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
log = logging.getLogger("model")

try:
    snapshot = ensure_model_snapshot(
        dict(snakemake.params.sglang), Path(snakemake.params.download_directory)
    )
except (ModelUnavailable, RecordedFileChanged) as error:
    log.error("%s", error)
    raise SystemExit(f"model: {error}") from None
write_json(Path(snakemake.output.snapshot), snapshot)
log.info(
    "model %s (%s, commit %s): %d files, %.1f GB at %s",
    snapshot["model"],
    snapshot["origin"],
    snapshot["commit"],
    len(snapshot["files"]),
    snapshot["total_bytes"] / 1e9,
    snapshot["path"],
)
