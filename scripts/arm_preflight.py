"""Snakemake shim: one arm's preflight. The intra-op threads its server will
start, a warning with the doctor's prescription when they are the study's trap,
and a refusal when the host lacks what this arm needs."""

import json
import logging
import sys
from pathlib import Path

from serving_study.config.prescription import published_fixes_tables
from serving_study.config.records import Arm, HostSharing, Workload
from serving_study.measure.host_sharing import preparation_lock
from serving_study.servers.host import arm_thread_plan, unmet_needs

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")

arm = Arm.from_config(snakemake.params.arm)
workload = Workload.from_config(snakemake.params.workload)
host = json.loads(Path(snakemake.input.host).read_text())
# From the config, not a param: how pipelines share the host re-runs no job.
sharing = HostSharing.from_config(snakemake.config["host_sharing"])
holder = f"preflight of arm {arm.name} of experiment {snakemake.wildcards.experiment}"
# Its probe starts a Python that imports torch: never beside a measurement.
with preparation_lock(sharing, holder):
    (plan,) = arm_thread_plan([arm], published_fixes_tables(snakemake.input.published))
needs = unmet_needs(host, snakemake.params.engine, [arm], [workload])
if plan["warning"]:
    logging.warning("WARNING: %s", plan["warning"])
if needs:
    raise SystemExit(f"This host cannot run arm {arm.name}:\n- " + "\n- ".join(needs))
Path(snakemake.output.plan).write_text(json.dumps(plan, indent=2) + "\n")
