"""A runner SIGKILLed mid-measurement leaves nothing that lasts.

The tiny study runs under Snakemake; once an arm's server is serving, the job's
runner (the process that started the server) gets SIGKILL, as from the OOM
killer, ``timeout --kill-after`` or a SLURM job kill: no teardown runs. Its
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
from study_helpers import docker, leaked_segments
from study_helpers import snakemake_command as study_command

from serving_study.servers.leftovers import alive, owner_of

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the arms' CPU quota is a cgroup only root can create"
)


def snakemake_command(workdir: Path, config: Path, *arguments: str) -> list[str]:
    return study_command(workdir, "--cores", "1", *arguments, config=config)


def wait_for(find, snakemake: subprocess.Popen, timeout_s: float = 900):
    """What ``find`` returns once it returns something (Snakemake still running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert snakemake.poll() is None, "snakemake ended before any arm served"
        found = find()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail("no arm's server served in time")


def serving_scheduler(snakemake: subprocess.Popen) -> psutil.Process | None:
    """An arm's ``sglang::scheduler`` among Snakemake's descendants (local runs)."""
    for process in psutil.Process(snakemake.pid).children(recursive=True):
        try:
            if process.cmdline()[:1] == ["sglang::scheduler"]:
                return process
        except psutil.NoSuchProcess:
            continue
    return None


def study_processes(workdir: Path) -> list[str]:
    """Server processes whose command names the study's directory."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if "serving_study.engine" in command and str(workdir) in command:
            found.append(f"{process.pid}: {command[:120]}")
    return found


def study_groups(experiment: str, owned_by=lambda owner: True) -> list[Path]:
    """The study's cgroups whose owner (see leftovers.owned_name) passes the test.
    Another study of the same experiment may be running on the host."""
    groups = []
    for hierarchy in ("cpu", "cpuacct", ""):
        parent = Path("/sys/fs/cgroup") / hierarchy / "serving-study"
        if parent.exists():
            groups += [
                path
                for path in parent.iterdir()
                if experiment in path.name
                and owner_of(path.name) is not None
                and owned_by(owner_of(path.name))
            ]
    return groups


def study_containers(experiment: str, owned_by=lambda owner: True) -> list[str]:
    """The study's containers (named after their cgroup) whose owner passes."""
    listed = docker("ps", "--all", "--format", "{{.Names}}", check=False)
    return [
        name
        for name in listed.stdout.split()
        if experiment in name
        and owner_of(name) is not None
        and owned_by(owner_of(name))
    ]


def gone(owner: int) -> bool:
    return not alive(owner)


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


def rerun_finishes_valid(workdir: Path, config: Path, experiment: str) -> None:
    resumed = subprocess.run(
        snakemake_command(workdir, config, "all", "--rerun-incomplete"),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for metrics_path in (workdir / "results" / experiment).glob("*/run*/metrics.json"):
        metrics = json.loads(metrics_path.read_text())
        assert metrics["valid"], (metrics_path, metrics["invalid_reasons"])


def test_a_killed_local_runner_takes_its_server_and_the_next_run_starts_clean(
    tmp_path,
):
    config, experiment = ROOT / "config/test/config.yaml", "test-embedded"
    workdir = tmp_path / "study"
    log = open(tmp_path / "first.log", "w")
    snakemake = subprocess.Popen(
        snakemake_command(workdir, config, "all"), stdout=log, stderr=subprocess.STDOUT
    )
    try:
        scheduler = wait_for(lambda: serving_scheduler(snakemake), snakemake)
        time.sleep(0.3)  # into the run; a tiny arm serves for about a second
        runner = scheduler.parent().parent()  # scheduler < server < runner
        runner.send_signal(signal.SIGKILL)
        assert snakemake.wait(timeout=300) != 0
    finally:
        if snakemake.poll() is None:
            snakemake.kill()
        log.close()
    # The parent-death signal: the server went with its runner, no teardown ran.
    deadline = time.monotonic() + 30
    while study_processes(workdir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert study_processes(workdir) == []
    dead_groups = {
        str(path) for path in study_groups(experiment, lambda o: o == runner.pid)
    }
    assert dead_groups, "the killed runner's cgroup stays until a run reaps it"

    rerun_finishes_valid(workdir, config, experiment)
    assert dead_groups <= set(reaped_by_the_rerun(workdir, experiment)["cgroups"])
    assert study_groups(experiment, owned_by=gone) == []
    assert study_processes(workdir) == []
    assert leaked_segments() == []


def serving_container_owner(snakemake: subprocess.Popen, experiment: str) -> int | None:
    """The runner (owner label) of a container of this Snakemake's study whose
    server has started its scheduler. Only this Snakemake's: another study of the
    same experiment may be running on the host."""
    ours = {child.pid for child in psutil.Process(snakemake.pid).children(True)}
    for name in study_containers(experiment):
        state = docker(
            "inspect",
            "--format",
            '{{.State.Pid}} {{index .Config.Labels "serving-study.owner"}}',
            name,
            check=False,
        ).stdout.split()
        if len(state) != 2 or state[0] == "0":
            continue
        try:
            children = psutil.Process(int(state[0])).children()
            titles = [child.cmdline()[:1] for child in children]
        except psutil.Error:
            continue
        if ["sglang::scheduler"] in titles and int(state[1]) in ours:
            return int(state[1])
    return None


@pytest.mark.docker
@pytest.mark.slow
def test_a_killed_runners_container_goes_and_the_next_run_starts_clean(
    docker_engine, tmp_path
):
    config, experiment = ROOT / "config/test/docker.yaml", "test-docker"
    workdir = tmp_path / "study"
    log = open(tmp_path / "first.log", "w")
    snakemake = subprocess.Popen(
        snakemake_command(workdir, config, "all"), stdout=log, stderr=subprocess.STDOUT
    )
    try:
        runner = wait_for(
            lambda: serving_container_owner(snakemake, experiment), snakemake, 1800
        )
        time.sleep(0.3)  # into the run; a tiny arm serves for about a second
        os.kill(runner, signal.SIGKILL)
        assert snakemake.wait(timeout=300) != 0
    finally:
        if snakemake.poll() is None:
            snakemake.kill()
        log.close()
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
