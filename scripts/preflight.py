"""Snakemake shim: describe the host, warn of the study's trap, refuse unfit hosts."""

import json
import logging
import sys
from pathlib import Path

from serving_study.host import describe_host, unmet_needs

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
log = logging.getLogger("preflight")

engine = snakemake.params.engine
host = describe_host(engine, snakemake.params.arms)
needs = unmet_needs(host, engine, snakemake.params.arms, snakemake.params.workloads)
for arm in host["arms"]:
    if arm["warning"]:
        log.warning("WARNING: %s", arm["warning"])
if needs:
    raise SystemExit("This host cannot run the experiment:\n- " + "\n- ".join(needs))
Path(snakemake.output.host).write_text(json.dumps(host, indent=2) + "\n")
log.info(
    "host: %s CPUs visible, cgroup %s", host["visible_cpus"], host["cgroup_version"]
)
