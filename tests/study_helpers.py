"""Helpers the whole-workflow and arm tests share: Snakemake on a test config, a
real arm's settings, and what a study may leave on the host (segments, cgroups,
processes, containers); and a child process a test drives line by line."""

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from serving_study.config import records
from serving_study.launch.plan import ContainerOptions, LaunchPlan, process_plan
from serving_study.measure.thread_cpu import ThreadCpuSnapshot, read_thread_cpu
from serving_study.servers.cgroup_hierarchy import QuotaUnavailable
from serving_study.servers.cgroups import CpuQuotaGroup, project_group_directories
from serving_study.servers.container_commands import container_name
from serving_study.servers.owners import alive, owner_of

ROOT = Path(__file__).resolve().parents[1]
TEST_CONFIG = ROOT / "config" / "test" / "config.yaml"
# Secrets a study's arm passes to its server by name (secret_environment), with
# values that must reach the server and no file (tests/test_secrets.py). The second
# name does not look secret: only secret_environment says so.
STUDY_SECRETS = {
    "HF_TOKEN": "sk-serving-study-canary-1234",
    "STUDY_PROBE_VALUE": "serving-study-canary-5678",
}


def arm_record(**fields) -> records.Arm:
    """An arm with the given fields, the required ones a test does not look at
    filled in (arm A of variant v on workload w, no quota, one request)."""
    defaults = {
        "name": "A",
        "variant": "v",
        "workload": "w",
        "cpu_quota": "none",
        "concurrency": 1,
        "requests": 1,
    }
    return records.Arm.from_config(defaults | fields)


def embedded_arm(name: str, *, requests: int, output_tokens: int) -> records.Arm:
    """An arm that runs for real: variant ``original`` on workload ``tiny`` over
    the CPU transport, at concurrency 4 under a quota of one core, with no
    environment of its own."""
    return records.Arm.from_config(
        {
            "name": name,
            "variant": "original",
            "workload": "tiny",
            "transport": "cpu",
            "cpu_quota": 1.0,
            "environment": {},
            "concurrency": 4,
            "requests": requests,
            "output_tokens": output_tokens,
        }
    )


def embedded_run_settings(
    *, decode_step_ms: int, warmup_requests: int, health_timeout_s: int
) -> dict:
    """The settings of a real run of the embedded engine in a local process, as
    the keyword arguments ``server_settings``, ``client`` and ``monitors`` that
    ``run_arm`` and ``measure_arm_overhead`` take: the stand-in model's decode
    step, the client's warm-up requests and how long it waits for a healthy
    server are the caller's; monitors sample at 10 Hz, threads at 1 Hz, no GPU."""
    embedded_engine = {
        "served_model_name": "test-model",
        "prefill_ms_per_image": 5,
        "decode_step_ms": decode_step_ms,
        "max_running_requests": 64,
        "scheduler_busy_fraction": 0,
        "preprocess_device": "auto",
    }
    client = {
        "warmup_requests": warmup_requests,
        "health_timeout_s": health_timeout_s,
        "request_timeout_s": 60,
        "max_dispatch_lag_ms": 100,
    }
    return {
        "server_settings": records.ServerSettings.from_config(
            {
                "engine": "embedded",
                "runtime": "local",
                "embedded_engine": embedded_engine,
            }
        ),
        "client": records.ClientSettings.from_config(client),
        "monitors": records.MonitorSettings.from_config(
            {"sample_hz": 10, "thread_sample_hz": 1, "gpu": "off"}
        ),
    }


def snakemake_command(
    workdir: Path, *arguments: str, config: Path | tuple[Path, ...] = TEST_CONFIG
) -> list[str]:
    """This workflow's Snakemake on ``config`` (one file, or several merged in
    order), working in ``workdir``. The config files come last, so that no target
    among ``arguments`` is taken for one."""
    configs = config if isinstance(config, tuple) else (config,)
    return [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        *arguments,
        "--configfile",
        *(str(path) for path in configs),
    ]


def snakemake_output(workdir: Path, *arguments: str, config=TEST_CONFIG) -> str:
    """What Snakemake printed, which must have succeeded (see snakemake_command)."""
    finished = subprocess.run(
        snakemake_command(workdir, *arguments, config=config),
        capture_output=True,
        text=True,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    return finished.stdout + finished.stderr


def touch_study(workdir: Path, config: Path, *forced_rules: str) -> None:
    """Every output of ``config``'s study made as an empty file (or folder), then
    touched by Snakemake so that its records say each job ran with today's params:
    a study as measured, in seconds. Only ``forced_rules`` are touched when named
    (a second study that found the shared resources it needs already made)."""
    summary = snakemake_output(workdir, "--summary", config=config).splitlines()
    header = summary.index(next(line for line in summary if line.startswith("output")))
    for line in summary[header + 1 :]:
        output = workdir / line.split("\t")[0]
        # Every file output of these studies has a suffix; a directory() one has none.
        if output.exists():
            continue
        if output.suffix:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.touch()
        else:
            output.mkdir(parents=True, exist_ok=True)
    forced = ("--forcerun", *forced_rules) if forced_rules else ("--forceall",)
    snakemake_output(workdir, "--touch", *forced, "--cores", "1", "all", config=config)


def planned_jobs(workdir: Path, config: Path, *arguments: str) -> set[tuple[str, str]]:
    """The jobs a dry run of ``config`` plans, as (rule, wildcards) pairs."""
    plan = snakemake_output(workdir, "-n", *arguments, config=config)
    jobs, rule = set(), None
    for line in plan.splitlines():
        if line.startswith(("rule ", "localrule ")):
            rule = line.split()[1].rstrip(":")
            jobs.add((rule, ""))
        elif line.strip().startswith("wildcards:") and rule:
            jobs.discard((rule, ""))
            jobs.add((rule, line.split(":", 1)[1].strip()))
            rule = None
    return jobs


def snakemake_refuses(config: Path) -> str:
    """Snakemake's dry run of this workflow on ``config``, which must fail before
    it builds the DAG (the config check runs first); its stderr, which says why."""
    finished = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert finished.returncode != 0
    assert "Building DAG" not in finished.stdout + finished.stderr
    return finished.stderr


def fault_study_config(
    base: Path, experiment: str, directory: Path, *, first_arm_only: bool = False
) -> tuple[Path, Path]:
    """``base`` (a test config) as a study of its own: named ``experiment``, so
    that what it leaves can be told from another study's; its arms serving for
    several seconds, a window wide enough to break into on a busy host; and its
    runs not judged by the host's other load, which is other tests' here. Config
    files for ``snakemake_command``, merged in order (a list is replaced).

    ``first_arm_only`` keeps the first arm alone (and no claims, which name
    both): for a fault that needs one serving arm, it spares the suite a second
    variant, image and arm."""
    arms = yaml.safe_load(base.read_text())["arms"]
    if first_arm_only:
        arms = arms[:1]
    changes = {
        "experiment": experiment,
        "embedded_engine": {"decode_step_ms": 20},
        "arms": [arm | {"requests": 40, "output_tokens": 32} for arm in arms],
        "host_sharing": {"max_other_load_cores": 4096, "max_steal_cores": 4096},
    }
    if first_arm_only:
        changes["claims"] = []
    override = directory / f"{experiment}.yaml"
    override.write_text(yaml.safe_dump(changes))
    return base, override


def _sigint_as_in_a_terminal() -> None:
    """In the child before exec: Ctrl-C's SIGINT handled as in a terminal.

    A shell that starts a command in the background without job control (as CI
    scripts do) makes it ignore SIGINT, and every process below inherits that:
    Python then installs no KeyboardInterrupt handler, and an interrupt test would
    see a study that the signal never reached."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def terminal_job(command: list[str], log_path: Path):
    """``command`` as a terminal starts a job: its own process group, which a
    signal reaches whole (``os.killpg``), SIGINT handled, output to ``log_path``.
    Whatever of the group still runs on leaving is killed."""
    with open(log_path, "w") as log:
        job = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_sigint_as_in_a_terminal,
        )
        try:
            yield job
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)


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


def serving_scheduler(ancestor: int) -> psutil.Process | None:
    """An arm's ``sglang::scheduler`` among the descendants of process
    ``ancestor`` (Snakemake, or the test that runs an arm): local runs only."""
    for process in psutil.Process(ancestor).children(recursive=True):
        try:
            if process.cmdline()[:1] == ["sglang::scheduler"]:
                return process
        except psutil.NoSuchProcess:
            continue
    return None


def job_log(workdir: Path, run: Path) -> Path:
    """The log of the Snakemake job that measures ``run``, a directory
    results/<experiment>/<arm>/run<k> (see rules/arms.smk)."""
    arm, experiment = run.parent.name, run.parent.parent.name
    logs = workdir / "results" / "logs" / "run_arm" / experiment
    return logs / arm / f"{run.name}.log"


def serving_run(workdir: Path, experiment: str) -> Path | None:
    """The run whose server serves its measured requests: its job log says they
    began, and its metrics are not written yet (one arm runs at a time)."""
    for run in (workdir / "results" / experiment).glob("*/run*"):
        log = job_log(workdir, run)
        if (
            log.exists()
            and "measured requests at concurrency" in log.read_text()
            and not (run / "metrics.json").exists()
        ):
            return run
    return None


def interrupt_serving_run(
    snakemake: subprocess.Popen,
    log_path: Path,
    workdir: Path,
    run: Path,
    signal_number: int = signal.SIGINT,
) -> None:
    """``signal_number`` to the whole process group of ``snakemake`` (started by
    ``terminal_job``, output to ``log_path``) once ``run`` serves its measured
    requests (``serving_run``), and proof that it landed in that arm: Snakemake
    fails in rule run_arm, the run's job log shows its runner stopped by
    KeyboardInterrupt, and the run has no metrics.json."""
    time.sleep(1.0)  # into the window, which lasts several seconds
    os.killpg(snakemake.pid, signal_number)
    returncode = snakemake.wait(timeout=300)
    output = log_path.read_text()
    assert returncode != 0, output[-3000:]
    assert "Error in rule run_arm" in output, output[-3000:]
    stopped = job_log(workdir, run).read_text()
    assert "KeyboardInterrupt" in stopped, stopped[-3000:]
    assert not (run / "metrics.json").exists(), "the interrupted run looks finished"


def leaked_segments() -> list[Path]:
    """SGLang segments whose creating process is gone (live ones are others')."""
    return [
        path
        for path in Path("/dev/shm").glob("sgl_shm_*")
        if not psutil.pid_exists(int(path.name.split("_")[-2]))
    ]


def gone(owner: int) -> bool:
    return not alive(owner)


def owner_pid(name: str) -> int | None:
    """The pid of the owner a cgroup's or container's name holds (owners.py)."""
    owner = owner_of(name)
    return None if owner is None else int(owner.split(".")[0])


def study_groups(experiment: str, owned_by=lambda owner: True) -> list[Path]:
    """The experiment's cgroups whose owner's pid (``owners.owned_name``) passes
    ``owned_by``, looked for where the servers code makes them: below this
    process's own cgroup and each CPU hierarchy's root, cgroup v1 or v2."""
    return [
        directory
        for directory in project_group_directories()
        if directory.name.startswith(f"{experiment}-")
        and owner_pid(directory.name) is not None
        and owned_by(owner_pid(directory.name))
    ]


def study_processes(workdir: Path) -> list[str]:
    """Server processes whose command names the study's directory, with their
    children (other work on the host is not ours to judge)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if "serving_study.engine" in command and str(workdir) in command:
            found.append(f"process {process.pid}: {command[:120]}")
            try:
                found += [f"child {child.pid}" for child in process.children(True)]
            except psutil.NoSuchProcess:
                continue
    return found


def study_leftovers(workdir: Path, experiment: str) -> list[str]:
    """What a stopped study left: segments whose creator is gone, any cgroup of
    its experiment, and its server processes. The experiment's name must be the
    study's own: another study of the same experiment could be running."""
    return [
        *(str(path) for path in leaked_segments()),
        *(str(path) for path in study_groups(experiment)),
        *study_processes(workdir),
    ]


def docker(*arguments: str, check: bool = True) -> subprocess.CompletedProcess:
    """The docker client (its DOCKER_HOST from the environment), output captured."""
    return subprocess.run(
        ["docker", *arguments], capture_output=True, text=True, check=check
    )


def study_containers(experiment: str, owned_by=lambda owner: True) -> list[str]:
    """The experiment's containers (named after their cgroup) whose owner passes."""
    listed = docker("ps", "--all", "--format", "{{.Names}}", check=False)
    return [
        name
        for name in listed.stdout.split()
        if name.startswith(container_name(f"{experiment}-"))
        and owner_pid(name) is not None
        and owned_by(owner_pid(name))
    ]


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
        if ["sglang::scheduler"] in titles and int(state[1].split(".")[0]) in ours:
            return int(state[1].split(".")[0])
    return None


def rerun_finishes_valid(
    workdir: Path, config: Path | tuple[Path, ...], experiment: str
) -> subprocess.CompletedProcess:
    """``--rerun-incomplete`` finishes the study: every run valid and counted in
    its arm's medians, none in the table of invalid runs. With ``--cores 2``, as
    the tests' whole studies run: preparation jobs two at a time, while a run
    still owns the host (its rule asks for every core)."""
    resumed = subprocess.run(
        snakemake_command(
            workdir, "--cores", "2", "all", "--rerun-incomplete", config=config
        ),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    results = workdir / "results" / experiment
    runs = list(results.glob("*/run*/metrics.json"))
    assert runs
    for metrics_path in runs:
        metrics = json.loads(metrics_path.read_text())
        assert metrics["valid"], (metrics_path, metrics["invalid_reasons"])
    assert (results / "report.html").exists()
    arms = pd.read_csv(results / "tables" / "arms.csv")
    assert (arms["n_total"] > 0).all() and (arms["n_valid"] == arms["n_total"]).all()
    assert pd.read_csv(results / "tables" / "invalid_runs.csv").empty
    return resumed


def git(repository: Path, *arguments: str) -> str:
    result = subprocess.run(
        [
            "git",
            "-c",
            "user.name=test",
            "-c",
            "user.email=test@example.org",
            *arguments,
        ],
        cwd=repository,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


@contextlib.contextmanager
def prompted_child(argv: list[str], ready: str):
    """``argv`` as a child that a test drives by lines on its stdin and stdout
    (text), once it has printed the line ``ready``. Killed on leaving."""
    child = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == f"{ready}\n"
        yield child
    finally:
        child.kill()
        child.wait()
        child.stdin.close()
        child.stdout.close()


def thread_cpu_window(
    child: subprocess.Popen, done: str, exit_timeout_s: float
) -> tuple[ThreadCpuSnapshot, ThreadCpuSnapshot]:
    """The per-thread CPU of a ``prompted_child`` read before and after its
    window: told "go", it works and then answers the line ``done``. Told to exit
    after that, it must, with code 0, within ``exit_timeout_s``."""
    before = read_thread_cpu(child.pid)
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.readline() == f"{done}\n"
    after = read_thread_cpu(child.pid)
    child.stdin.write("exit\n")
    child.stdin.flush()
    assert child.wait(timeout=exit_timeout_s) == 0
    return before, after


def cgroups_usable() -> str | None:
    """Why real cgroup tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "creating cgroups needs root"
    try:
        probe = CpuQuotaGroup.create(f"probe-{uuid.uuid4().hex[:8]}", None)
    except QuotaUnavailable as error:
        return f"no writable CPU cgroup: {error}"
    probe.remove()
    return None


needs_cgroups = pytest.mark.skipif(
    (reason := cgroups_usable()) is not None, reason=reason or ""
)


# What differs between two starts of one plan: the run's port, and the names and
# labels that make its cgroup and container its own (LaunchPlan's per-run fields).
PER_RUN_OPTIONS = ("--name", "--label", "--port")


def without_per_run_values(argv: list[str]) -> list[str]:
    """``argv`` with its per-run values masked and the run's port (last) left out."""
    if argv[-2:-1] == ["--port"]:
        argv = argv[:-2]
    return [
        "<per run>" if index and argv[index - 1] in PER_RUN_OPTIONS else item
        for index, item in enumerate(argv)
    ]


def assert_ran_as_planned(workdir: Path, experiment: str, arm: str, run: int = 1):
    """The run started the plan that ``commands/<arm>.json`` holds, as it is: the
    same argv, environment (names and values), quota, container options and
    checks, apart from the run's own port and names."""
    results = workdir / "results" / experiment
    planned = json.loads((results / "commands" / f"{arm}.json").read_text())
    ran = json.loads((results / arm / f"run{run}" / "provenance.json").read_text())
    plan, launch = planned["launch"], ran["launch"]
    assert {
        key: value for key, value in plan.items() if key not in ("port", "command")
    } == {key: value for key, value in launch.items() if key not in ("port", "command")}
    assert launch["command"] == [*launch["argv"], "--port", str(launch["port"])]
    if plan["container"] is None:
        # The local runtime adds only the helper that joins the run's cgroup.
        assert ran["runtime_argv"][-len(launch["command"]) - 1 :] == [
            "--",
            *launch["command"],
        ]
    else:
        assert without_per_run_values(ran["runtime_argv"]) == without_per_run_values(
            planned["runtime_argv"]
        )
    return plan


def container_plan(
    argv: list[str],
    image: str,
    *,
    runtime: str = "docker",
    environment: dict[str, str] | None = None,
    secret_environment: tuple[str, ...] = (),
    quota_cores: float | None = None,
    quota_timing: str = "start",
    shm_size: str | None = "64m",
    ipc_host: bool = False,
    gpus: str | None = None,
    read_only_mounts: tuple = (),
) -> LaunchPlan:
    """The plan of ``argv`` in a container of ``image``: a process of no engine,
    with what the test gives of the environment, quota and container."""
    plan = process_plan(argv, quota_cores, timing=quota_timing)
    return dataclasses.replace(
        plan,
        environment=dict(environment or {}),
        secret_environment=tuple(secret_environment),
        host_environment=(),
        container=ContainerOptions(
            runtime=runtime,
            image=image,
            shm_size=None if ipc_host else shm_size,
            ipc_host=ipc_host,
            gpus=gpus,
            read_only_mounts=tuple(read_only_mounts),
            writable_mounts=(),
        ),
    )
