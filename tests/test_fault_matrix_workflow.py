"""The fault matrix, whole workflow: faults that strike a study in progress.

A results directory that turns read-only after the first run was measured, and
Ctrl-C while an arm's container serves. Each time Snakemake must fail saying
why, keep what was already measured, leave no server process, cgroup,
container or shared-memory segment, and ``--rerun-incomplete`` (results
writable again) must finish the study with every run valid and averaged.
"""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from study_helpers import (
    ROOT,
    TEST_CONFIG,
    fault_study_config,
    interrupt_serving_run,
    leaked_segments,
    rerun_finishes_valid,
    serving_container_owner,
    serving_run,
    snakemake_command,
    study_containers,
    study_groups,
    study_leftovers,
    terminal_job,
    wait_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the arms' CPU quota is a cgroup only root can create"
    ),
]


def first_measured_run(results: Path) -> Path | None:
    """A run whose metrics.json is whole (the runner writes it last)."""
    for metrics in results.glob("*/run*/metrics.json"):
        try:
            json.loads(metrics.read_text())
        except ValueError:
            continue
        return metrics.parent
    return None


def files_of(run: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(run.iterdir())}


@pytest.mark.skipif(
    not (shutil.which("unshare") and shutil.which("nsenter")),
    reason="needs util-linux unshare and nsenter",
)
def test_results_turning_read_only_mid_study_fail_it_and_keep_what_was_measured(
    tmp_path,
):
    experiment = "fault-read-only"
    workdir = tmp_path / "study"
    results = workdir / "results"
    config = fault_study_config(TEST_CONFIG, experiment, tmp_path)
    log_path = tmp_path / "read-only.log"
    # Snakemake in a mount namespace of its own: results/ turns read-only there
    # only, and the rerun below sees it writable.
    with open(log_path, "w") as log:
        snakemake = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private"]
            + snakemake_command(workdir, "--cores", "2", "all", config=config),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            measured = wait_for(
                lambda: first_measured_run(results / experiment), snakemake
            )
            subprocess.run(
                ["nsenter", f"--target={snakemake.pid}", "--mount", "sh", "-c"]
                + ['mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"']
                + ["sh", str(results)],
                check=True,
            )
            kept = files_of(measured)
            returncode = snakemake.wait(timeout=600)
        finally:
            if snakemake.poll() is None:
                snakemake.kill()
    output = log_path.read_text()
    assert returncode != 0, output[-3000:]
    assert "Read-only file system" in output, output[-3000:]
    assert json.loads(kept["metrics.json"])["valid"]
    assert files_of(measured) == kept
    assert not (results / experiment / "report.html").exists()
    assert study_leftovers(workdir, experiment) == []

    rerun_finishes_valid(workdir, config, experiment)
    assert files_of(measured) == kept, "the rerun measured the kept run again"
    assert study_leftovers(workdir, experiment) == []


@pytest.mark.docker
def test_ctrl_c_while_an_arm_container_serves_leaves_nothing(docker_engine, tmp_path):
    experiment = "fault-docker-interrupt"
    workdir = tmp_path / "study"
    config = fault_study_config(
        ROOT / "config" / "test" / "docker.yaml",
        experiment,
        tmp_path,
        first_arm_only=True,
    )
    log_path = tmp_path / "interrupted.log"
    command = snakemake_command(workdir, "--cores", "2", "all", config=config)
    with terminal_job(command, log_path) as snakemake:
        run = wait_for(lambda: serving_run(workdir, experiment), snakemake, 1800)
        assert serving_container_owner(snakemake, experiment), "no container"
        interrupt_serving_run(snakemake, log_path, workdir, run)
    deadline = time.monotonic() + 120
    while study_containers(experiment) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert study_containers(experiment) == []
    assert study_groups(experiment) == []
    assert leaked_segments() == []

    rerun_finishes_valid(workdir, config, experiment)
    assert study_containers(experiment) == []
    assert study_leftovers(workdir, experiment) == []
