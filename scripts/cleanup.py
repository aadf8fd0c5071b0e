"""Snakemake shim: remove what dead runs of this project left on the host, now,
under the host's measurement lock (what every run and preflight does first)."""

import logging
import sys

from serving_study.config.records import HostSharing
from serving_study.measure.host_sharing import MeasurementLock
from serving_study.servers.host import container_runtimes
from serving_study.servers.leftovers import reap_leftovers

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")

sharing = HostSharing.from_config(snakemake.config["host_sharing"])
answering = tuple(
    name
    for name, runtime in container_runtimes().items()
    if runtime["engine_reachable"]
)
with MeasurementLock.acquire(sharing, "cleanup"):
    reaped = reap_leftovers(answering)
print(f"removed: {reaped.summary()}", file=sys.__stdout__)
for problem in reaped.problems:
    print(f"not removed: {problem}", file=sys.__stdout__)
