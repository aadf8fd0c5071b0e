"""Snakemake shim: remove what dead runs left, describe the host, refuse a host
that lacks what the engine needs (each arm's own needs: arm_preflight.py)."""

import json
import logging
import sys
from pathlib import Path

from serving_study.config.records import HostSharing
from serving_study.measure.host_sharing import MeasurementLock, preparation_lock
from serving_study.servers.host import container_runtimes, describe_host, unmet_needs
from serving_study.servers.leftovers import reap_leftovers

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")

engine = snakemake.params.engine
# From the config, not a param: how pipelines share the host re-runs no job.
sharing = HostSharing.from_config(snakemake.config["host_sharing"])
answering = tuple(
    name
    for name, runtime in container_runtimes().items()
    if runtime["engine_reachable"]
)
# Under the lock: no other pipeline's server is up while its leftovers are judged.
holder = f"preflight of experiment {snakemake.wildcards.experiment}"
with MeasurementLock.acquire(sharing, holder):
    reaped = reap_leftovers(answering)
# Its probes start processes of their own: never beside a measurement.
with preparation_lock(sharing, holder):
    host = describe_host(engine)
host["leftovers_reaped"] = reaped.to_dict()
needs = unmet_needs(host, engine, [])
if needs:
    raise SystemExit("This host cannot run the experiment:\n- " + "\n- ".join(needs))
Path(snakemake.output.host).write_text(json.dumps(host, indent=2) + "\n")
logging.info(
    "host: %s CPUs visible, cgroup %s", host["visible_cpus"], host["cgroup_version"]
)
