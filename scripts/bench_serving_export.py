"""Snakemake shim: one run of ours in SGLang bench_serving's result format."""

import json
import logging
import sys
from pathlib import Path

from serving_study.measure.request_log import read_request_log
from serving_study.studies.bench_serving_result import run_result, write_result

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

inputs = snakemake.input
provenance = json.loads(Path(inputs.provenance).read_text())
result = run_result(
    read_request_log(Path(inputs.requests)),
    json.loads(Path(inputs.metrics).read_text()),
    server_info=provenance.get("server_info"),
    details=True,
)
write_result(Path(snakemake.output.result), result)
