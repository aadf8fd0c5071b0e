"""Interrupting the study during an arm: nothing leaks, and a rerun finishes it.

Snakemake runs the tiny config as a study of its own whose arms serve for several
seconds. While the first arm's server serves, Snakemake's whole process group
gets SIGINT, as from Ctrl-C in a terminal, or SIGTERM, as from a batch system
stopping the job. The test fails unless the signal landed in that arm: Snakemake
exits non-zero, the arm's job log shows its runner interrupted, the serving run
has no metrics.json and the study has no report. No server process, cgroup or
shared-memory segment of the study may be left, and ``--rerun-incomplete``
completes the study with every run valid.
"""

import os
import signal
import time
from pathlib import Path

import pytest
from study_helpers import (
    TEST_CONFIG,
    fault_study_config,
    interrupt_serving_run,
    rerun_finishes_valid,
    serving_run,
    snakemake_command,
    study_leftovers,
    terminal_job,
    wait_for,
)

EXPERIMENT = "test-interrupt"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the arms' CPU quota is a cgroup only root can create"
)


def leftovers_once_settled(workdir: Path, timeout_s: float = 30) -> list[str]:
    """What the study left, once exiting processes had time to go."""
    deadline = time.monotonic() + timeout_s
    while (found := study_leftovers(workdir, EXPERIMENT)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    return found


def interrupt_then_resume(tmp_path: Path, signal_number: int) -> None:
    workdir = tmp_path / "study"
    results = workdir / "results" / EXPERIMENT
    config = fault_study_config(TEST_CONFIG, EXPERIMENT, tmp_path, first_arm_only=True)
    log_path = tmp_path / "interrupted.log"
    command = snakemake_command(workdir, "--cores", "2", "all", config=config)
    with terminal_job(command, log_path) as snakemake:
        run = wait_for(lambda: serving_run(workdir, EXPERIMENT), snakemake)
        assert not list(results.glob("*/run*/metrics.json")), "not the first arm"
        interrupt_serving_run(snakemake, log_path, workdir, run, signal_number)
    assert not (results / "report.html").exists()
    assert leftovers_once_settled(workdir) == []

    rerun_finishes_valid(workdir, config, EXPERIMENT)
    assert leftovers_once_settled(workdir) == []


def test_ctrl_c_during_an_arm_then_rerun_incomplete_finishes(tmp_path):
    interrupt_then_resume(tmp_path, signal.SIGINT)


@pytest.mark.slow
def test_sigterm_during_an_arm_then_rerun_incomplete_finishes(tmp_path):
    interrupt_then_resume(tmp_path, signal.SIGTERM)
