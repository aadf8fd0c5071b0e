"""Snakemake shim: the arm's workload as bench_serving's `openai` dataset, our
client's measured requests line for line."""

import logging
import sys
from pathlib import Path

from serving_study.files import write_json
from serving_study.studies.bench_serving_dataset import write_dataset

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")

params = snakemake.params
record = write_dataset(
    Path(snakemake.input.workload),
    Path(snakemake.output.dataset),
    warmup_requests=params.warmup_requests,
    measured_requests=params.requests,
    output_tokens=params.output_tokens,
)
write_json(Path(snakemake.output.record), record)
logging.info("%d requests of %d images", record["lines"], record["distinct_images"])
