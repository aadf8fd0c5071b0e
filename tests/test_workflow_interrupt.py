"""Interrupting Snakemake during an arm: nothing leaks, and a rerun finishes the study.

Snakemake is started on the tiny config, then sent SIGINT (Ctrl-C) or SIGTERM while
an arm's server is serving. Afterwards no server process, cgroup or shared-memory
segment of the run may be left, no half-written run may count as done, and
``--rerun-incomplete`` completes the whole study with every run valid.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from study_helpers import snakemake_command as study_command

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "test" / "config.yaml"
EXPERIMENT = "test-embedded"


def snakemake_command(workdir: Path, *arguments: str) -> list[str]:
    return study_command(workdir, "--cores", "1", *arguments)


pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the arms' CPU quota is a cgroup only root can create"
)


def wait_for_a_serving_arm(snakemake: subprocess.Popen, timeout_s: float = 300):
    """Return once a scheduler of an arm's server has run for a moment."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert snakemake.poll() is None, "snakemake ended before any arm started"
        for process in psutil.Process(snakemake.pid).children(recursive=True):
            try:
                if process.cmdline()[:1] == ["sglang::scheduler"]:
                    # Soon: a tiny arm serves for about a second, and a signal
                    # after its last run would find no arm to interrupt.
                    time.sleep(0.3)
                    return
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.1)
    pytest.fail("no arm's server started in time")


def leftovers(workdir: Path) -> list[str]:
    """What this study left: segments, cgroups, and server processes whose command
    names the study's directory (other work on the host is not ours to judge)."""
    found = [
        str(path)
        for path in Path("/dev/shm").glob("sgl_shm_*")
        if not psutil.pid_exists(int(path.name.split("_")[-2]))  # creator is gone
    ]
    for hierarchy in ("cpu", "cpuacct"):
        parent = Path("/sys/fs/cgroup") / hierarchy / "serving-study"
        if parent.exists():
            found += [str(p) for p in parent.iterdir() if EXPERIMENT in p.name]
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if "serving_study.engine" in command and str(workdir) in command:
            found.append(f"process {process.pid}: {command[:120]}")
            found += [f"child {child.pid}" for child in process.children(True)]
    return found


def interrupt_then_resume(workdir: Path, signal_number: int) -> None:
    log = open(workdir.parent / f"{workdir.name}-first.log", "w")
    snakemake = subprocess.Popen(
        snakemake_command(workdir, "all"), stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for_a_serving_arm(snakemake)
        snakemake.send_signal(signal_number)
        assert snakemake.wait(timeout=120) != 0
    finally:
        if snakemake.poll() is None:
            snakemake.kill()
        log.close()
    time.sleep(1.0)
    assert leftovers(workdir) == []
    finished_runs = list((workdir / "results" / EXPERIMENT).glob("*/run*/metrics.json"))
    assert len(finished_runs) < 2, "the interrupted run must not look finished"

    resumed = subprocess.run(
        snakemake_command(workdir, "all", "--rerun-incomplete"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for metrics_path in (workdir / "results" / EXPERIMENT).glob("*/run*/metrics.json"):
        metrics = json.loads(metrics_path.read_text())
        assert metrics["valid"], (metrics_path, metrics["invalid_reasons"])
    assert (workdir / "results" / EXPERIMENT / "report.html").exists()
    assert leftovers(workdir) == []


def test_ctrl_c_during_an_arm_then_rerun_incomplete_finishes(tmp_path):
    interrupt_then_resume(tmp_path / "study", signal.SIGINT)


@pytest.mark.slow
def test_sigterm_during_an_arm_then_rerun_incomplete_finishes(tmp_path):
    interrupt_then_resume(tmp_path / "study", signal.SIGTERM)
