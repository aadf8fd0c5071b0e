"""The node a run ran on, and whether it is the host its host.json describes.

On one host the preflight and every run share the machine. Under SLURM each is its
own job and may land on another node of the partition, so a run records its node
(hostname, SLURM job id, CPU model, visible CPUs) and names the fields where it
differs from host.json. The difference is a flag for the reader, not a reason to
discard the run: a node of the same kind is a fair place to measure.
"""

from __future__ import annotations

import logging
import os
import platform

from serving_study.servers.host import cpu_model

# The node's fields that host.json records too (servers/host.py, describe_host).
FIELDS_SHARED_WITH_HOST = ("hostname", "cpu_model", "visible_cpus")

log = logging.getLogger(__name__)


def describe_node() -> dict:
    """The node this process runs on, as host.json names the same facts; the
    SLURM job id is None outside a SLURM job."""
    return {
        "hostname": platform.node(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "cpu_model": cpu_model(),
        "visible_cpus": len(os.sched_getaffinity(0)),
    }


def node_record(host: dict) -> dict:
    """What a run's provenance holds of its node: ``node`` (describe_node) and
    ``node_differs_from_host``, the fields in which it differs from the host
    description ``host`` among those both record, with a warning when any does."""
    node = describe_node()
    differences = [
        field
        for field in FIELDS_SHARED_WITH_HOST
        if field in host and host[field] != node[field]
    ]
    if differences:
        log.warning(
            "this run's node differs from the host host.json describes in %s: "
            "node %s, host.json %s",
            ", ".join(differences),
            {field: node[field] for field in differences},
            {field: host[field] for field in differences},
        )
    return {"node": node, "node_differs_from_host": differences}
