"""Snakemake shim: install (or reuse) the packages SGLang's server lacks beside
this GPU host's own Python and torch."""

import logging
import sys
from pathlib import Path

from serving_study.config.records import HostSharing
from serving_study.measure.host_sharing import preparation_lock
from serving_study.sources.host_torch_runtime import ensure_host_torch_runtime
from serving_study.sources.sglang_runtime import RuntimeBuildError

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
log = logging.getLogger("sglang_host_torch_runtime")

runtime_record = Path(snakemake.output.runtime)
# From the config, not a param: how pipelines share the host re-runs no job.
sharing = HostSharing.from_config(snakemake.config["host_sharing"])
try:
    with preparation_lock(sharing, f"sglang_host_torch_runtime of {runtime_record}"):
        record = ensure_host_torch_runtime(
            Path(snakemake.input.lock), runtime_record.parent, progress=log.info
        )
except RuntimeBuildError as error:
    log.error("%s", error)
    raise SystemExit(f"sglang_host_torch_runtime: {error}") from None
log.info(
    "runtime: %s (Python %s) with torch %s (SGLang pins %s), packages in %s",
    record["python"],
    record["python_version"],
    record["packages"].get("torch"),
    record["sglang_pins"].get("torch"),
    record["site"],
)
