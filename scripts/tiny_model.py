"""Snakemake shim: write the seeded tiny Qwen3-VL and record its files.

The model directory is ``model/`` beside the record, so the record and the model it
names always travel together.
"""

import logging
import sys
from pathlib import Path

from serving_study.files import write_json
from serving_study.sources.tiny_model import write_tiny_qwen3_vl
from serving_study.sources.tiny_model_settings import TinyModelError, TinyModelSettings

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
log = logging.getLogger("tiny_model")

record_path = Path(snakemake.output.snapshot)
try:
    settings = TinyModelSettings.from_config(dict(snakemake.params.settings))
except TinyModelError as error:
    log.error("%s", error)
    raise SystemExit(f"tiny model: {error}") from None
snapshot = write_tiny_qwen3_vl(record_path.parent / "model", settings)
write_json(record_path, snapshot)
log.info(
    "model %s (%s, seed %d, %s): %d files, %d bytes at %s, served with "
    "--load-format %s",
    settings.directory_name,
    snapshot["origin"],
    settings.seed,
    settings.dtype,
    len(snapshot["files"]),
    snapshot["total_bytes"],
    snapshot["path"],
    snapshot["load_format"],
)
