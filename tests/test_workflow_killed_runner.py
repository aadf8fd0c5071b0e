"""A runner SIGKILLed mid-measurement leaves nothing that lasts.

The tiny study runs under Snakemake as a study of its own whose arms serve for
several seconds; once an arm's server is serving, the job's runner (the process
that started the server) gets SIGKILL, as from the OOM killer,
``timeout --kill-after`` or a SLURM job kill: no teardown runs. Its
server must die with it, and the next run must start clean: it removes the dead
run's cgroups, container and segments (and says so in its provenance), the
study finishes with every run valid, and nothing of it is left on the host.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from study_helpers import (
    ROOT,
    fault_study_config,
    gone,
    leaked_segments,
    rerun_finishes_valid,
    serving_container_owner,
    serving_run,
    serving_scheduler,
    snakemake_command,
    study_containers,
    study_groups,
    study_processes,
    terminal_job,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the arms' CPU quota is a cgroup only root can create"
)


def kill_serving_runner(
    workdir: Path,
    config: tuple[Path, ...],
    experiment: str,
    find_runner,
    timeout_s: float = 900,
) -> int:
    """The study of ``config`` under Snakemake in ``workdir`` (its output in
    first.log beside it) until an arm's server serves; then SIGKILL, in the
    measured window, to that arm's runner: the pid ``find_runner`` finds from
    the Snakemake process. Snakemake must fail; the runner's pid is returned."""
    command = snakemake_command(workdir, "--cores", "2", "all", config=config)
    with terminal_job(command, workdir.parent / "first.log") as snakemake:
        wait_for(lambda: serving_run(workdir, experiment), snakemake, timeout_s)
        runner = find_runner(snakemake)
        time.sleep(1.0)  # into the window, which lasts several seconds
        os.kill(runner, signal.SIGKILL)
        assert snakemake.wait(timeout=300) != 0
    return runner


def reaped_by_the_rerun(workdir: Path, experiment: str) -> dict[str, list]:
    """What the rerun's arms say they removed, all runs together."""
    reaped: dict[str, list] = {"cgroups": [], "containers": [], "segments": []}
    for provenance_path in (workdir / "results" / experiment).glob(
        "*/run*/provenance.json"
    ):
        provenance = json.loads(provenance_path.read_text())
        for kind in reaped:
            reaped[kind] += provenance["leftovers_reaped"][kind]
    return reaped


def test_a_killed_local_runner_takes_its_server_and_the_next_run_starts_clean(
    tmp_path,
):
    experiment = "test-killed-runner"
    config = fault_study_config(
        ROOT / "config/test/config.yaml", experiment, tmp_path, first_arm_only=True
    )
    workdir = tmp_path / "study"

    def runner_of_the_scheduler(snakemake: subprocess.Popen) -> int:
        scheduler = serving_scheduler(snakemake.pid)
        assert scheduler, "the arm's server has no scheduler"
        return scheduler.parent().parent().pid  # scheduler < server < runner

    runner = kill_serving_runner(workdir, config, experiment, runner_of_the_scheduler)
    # The parent-death signal: the server went with its runner, no teardown ran.
    deadline = time.monotonic() + 30
    while study_processes(workdir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert study_processes(workdir) == []
    dead_groups = {
        str(path) for path in study_groups(experiment, lambda o: o == runner)
    }
    assert dead_groups, "the killed runner's cgroup stays until a run reaps it"

    rerun_finishes_valid(workdir, config, experiment)
    assert dead_groups <= set(reaped_by_the_rerun(workdir, experiment)["cgroups"])
    assert study_groups(experiment, owned_by=gone) == []
    assert study_processes(workdir) == []
    assert leaked_segments() == []


@pytest.mark.docker
@pytest.mark.slow
def test_a_killed_runners_container_goes_and_the_next_run_starts_clean(
    docker_engine, tmp_path
):
    experiment = "test-killed-docker"
    config = fault_study_config(
        ROOT / "config/test/docker.yaml", experiment, tmp_path, first_arm_only=True
    )
    workdir = tmp_path / "study"

    def owner_of_the_container(snakemake: subprocess.Popen) -> int:
        runner = serving_container_owner(snakemake, experiment)
        assert runner, "the arm's server serves in no container"
        return runner

    runner = kill_serving_runner(
        workdir, config, experiment, owner_of_the_container, 1800
    )
    # The watchdog removes the container once its runner is gone.
    deadline = time.monotonic() + 120

    def killed(owner: int) -> bool:
        return owner == runner

    while study_containers(experiment, killed) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert study_containers(experiment, killed) == []

    rerun_finishes_valid(workdir, config, experiment)
    assert study_containers(experiment, owned_by=gone) == []
    assert leaked_segments() == []


def processes_of(workdir: Path) -> list[str]:
    """Every process whose command names the study's directory (its runners and
    their servers)."""
    return [
        f"process {process.pid}: {' '.join(process.info['cmdline'])[:120]}"
        for process in psutil.process_iter(["cmdline"])
        if str(workdir) in " ".join(process.info["cmdline"] or [])
    ]


def test_snakemake_killed_outright_takes_its_runner_and_the_rerun_holds_nothing_of_it(
    tmp_path,
):
    experiment = "test-killed-snakemake"
    config = fault_study_config(
        ROOT / "config/test/config.yaml", experiment, tmp_path, first_arm_only=True
    )
    workdir = tmp_path / "study"
    kill_serving_runner(workdir, config, experiment, lambda snakemake: snakemake.pid)
    # The runner's watchdog saw Snakemake go and tore its server down.
    deadline = time.monotonic() + 60
    while processes_of(workdir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(workdir) == []
    attempts = workdir / "results" / experiment / "attempts"
    killed = {path.name for path in attempts.glob("*/run*/*.partial")}
    assert killed, "the killed attempt stays until the run is measured again"

    # Snakemake killed outright leaves its directory locked, as it says.
    unlocked = subprocess.run(
        snakemake_command(workdir, "--unlock", config=config), capture_output=True
    )
    assert unlocked.returncode == 0, unlocked.stderr[-2000:]
    rerun_finishes_valid(workdir, config, experiment)
    assert list(attempts.glob("*/run*/*.partial")) == []
    for listing in (workdir / "results" / experiment).glob("*/run*/attempts.json"):
        names = {entry["attempt"] for entry in json.loads(listing.read_text())}
        assert not {name.removesuffix(".partial") for name in killed} & names
    assert leaked_segments() == []
