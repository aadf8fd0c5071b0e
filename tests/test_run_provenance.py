"""What ties a run record to its code and config, on real inputs."""

import json
import logging
import os
import socket
import subprocess
import sys
from importlib import metadata

from serving_study.config.content_keys import canonical_sha256
from serving_study.measure.run_provenance import project_commit, run_provenance
from serving_study.servers.host import cpu_model


def git(directory, *arguments):
    subprocess.run(
        ["git", "-C", str(directory), *arguments],
        check=True,
        capture_output=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.org",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.org",
            "PATH": "/usr/bin:/bin",
        },
    )


def test_the_commit_and_a_dirty_tree_are_seen(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "commit", "-q", "-m", "first")
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert project_commit(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "untracked.txt").write_text("not part of the tree\n")
    assert project_commit(tmp_path)["dirty"] is False
    (tmp_path / "a.txt").write_text("two\n")
    assert project_commit(tmp_path) == {"commit": head, "dirty": True}


def test_outside_a_checkout_both_are_unknown(tmp_path):
    assert project_commit(tmp_path) == {"commit": None, "dirty": None}


def test_the_config_hash_ignores_key_order_and_sees_every_value():
    first = {"arms": [{"name": "A", "cpu_quota": 0.5}], "seed": 1}
    reordered = {"seed": 1, "arms": [{"cpu_quota": 0.5, "name": "A"}]}
    changed = {"seed": 1, "arms": [{"cpu_quota": 0.25, "name": "A"}]}
    assert canonical_sha256(first) == canonical_sha256(reordered)
    assert canonical_sha256(first) != canonical_sha256(changed)


def test_the_runner_s_torch_version_is_read_without_importing_torch():
    # Importing torch cost each run ~3 s before its server started.
    script = (
        "import json, sys\n"
        "from serving_study.measure.run_provenance import run_provenance\n"
        "record = run_provenance({}, {}, {'source': {}})\n"
        "print(json.dumps([record['versions']['torch_of_runner'],"
        " 'torch' in sys.modules]))\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    version, imported = json.loads(finished.stdout)
    assert version == metadata.version("torch")
    assert imported is False


def test_a_run_records_its_node_and_flags_a_node_host_json_does_not_describe(
    monkeypatch, caplog
):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    node = {
        "hostname": socket.gethostname(),
        "slurm_job_id": "4242",
        "cpu_model": cpu_model(),
        "visible_cpus": len(os.sched_getaffinity(0)),
    }
    # host.json as the preflight wrote it on this node (a few of its fields).
    this_host = {
        "hostname": node["hostname"],
        "cpu_model": node["cpu_model"],
        "cpu_count": os.cpu_count(),
        "visible_cpus": node["visible_cpus"],
        "kernel": "any",
    }
    with caplog.at_level(logging.WARNING):
        record = run_provenance({}, this_host, {"source": {}})
    assert record["node"] == node
    assert record["node_differs_from_host"] == []
    assert "differs" not in caplog.text

    # The preflight ran on another node of the partition, with more CPUs.
    other_node = this_host | {
        "hostname": "gpu-node-17",
        "visible_cpus": node["visible_cpus"] + 64,
    }
    with caplog.at_level(logging.WARNING):
        record = run_provenance({}, other_node, {"source": {}})
    assert record["node"] == node
    assert record["node_differs_from_host"] == ["hostname", "visible_cpus"]
    assert "differs from the host host.json describes in hostname, visible_cpus" in (
        caplog.text
    )


def test_outside_slurm_a_run_has_no_job_id(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    record = run_provenance({}, {}, {"source": {}})
    assert record["node"]["slurm_job_id"] is None
    # An empty host description describes nothing to differ from.
    assert record["node_differs_from_host"] == []
