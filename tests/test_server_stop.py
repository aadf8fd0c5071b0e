"""How a server is asked to stop: the signal its kind of server answers at once.

SGLang's main process takes SIGTERM as a request to drain, which it polls every
5 s; SIGINT reaches uvicorn, which stops an idle server at once. The runner sends
SGLang servers SIGINT (to the main process, which stops its children itself) and
every other server SIGTERM (to its whole process group).
"""

import dataclasses
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from serving_study.launch.plan import ContainerOptions, process_plan
from serving_study.servers.container_commands import run_command
from serving_study.servers.local_runtime import LocalServer

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a server's CPU quota is a cgroup only root can create"
)

SIGNAL_REPORTING_SERVER = """
import multiprocessing, os, signal, time

def report(signal_number, frame):
    print(f"{multiprocessing.current_process().name} got "
          f"{signal.Signals(signal_number).name}", flush=True)
    os._exit(0)

def child():
    signal.signal(signal.SIGTERM, report)
    signal.signal(signal.SIGINT, report)
    time.sleep(600)

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, report)
    signal.signal(signal.SIGINT, report)
    multiprocessing.Process(target=child, name="child").start()
    print("ready", flush=True)
    time.sleep(600)
"""


@contextmanager
def ready_server(
    tmp_path,
    program: str,
    label: str,
    quota_cores=None,
    terminate_leader_only=False,
    stop_signal=signal.SIGTERM,
):
    """A LocalServer running ``program`` (under ``quota_cores`` from its start),
    once it printed "ready"; stopped on exit."""
    script = tmp_path / "server.py"
    script.write_text(program)
    plan = process_plan(
        [sys.executable, str(script)],
        quota_cores,
        stop_leader_only=terminate_leader_only,
    )
    plan = dataclasses.replace(plan, stop_signal=stop_signal.name)
    server = LocalServer(
        plan, f"stop-test-{os.getpid()}-{label}", tmp_path / "server.log"
    )
    server.start()
    try:
        deadline = time.monotonic() + 30
        while "ready" not in server.log_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "ready" in server.log_tail()
        yield server
    finally:
        server.stop(grace_s=30)


def stopped_server_log(tmp_path, **stop_settings) -> str:
    with ready_server(
        tmp_path, SIGNAL_REPORTING_SERVER, str(len(stop_settings)), **stop_settings
    ):
        pass
    return (tmp_path / "server.log").read_text()


def test_an_sglang_server_gets_sigint_in_its_main_process_alone(tmp_path):
    log = stopped_server_log(
        tmp_path, terminate_leader_only=True, stop_signal=signal.SIGINT
    )
    assert "MainProcess got SIGINT" in log
    assert "child got" not in log  # the main process stops its children itself


def test_other_servers_get_sigterm_in_every_process(tmp_path):
    log = stopped_server_log(tmp_path)
    assert "MainProcess got SIGTERM" in log
    assert "child got SIGTERM" in log


# Prints the quota of its own group when asked to stop.
QUOTA_REPORTING_SERVER = """
import json, os, signal, time
from serving_study.servers.cpu_group import group_of_pid

def report(signal_number, frame):
    quota = group_of_pid(os.getpid()).quota_in_force()
    print("quota at stop:", json.dumps(quota["cores"]), flush=True)
    os._exit(0)

signal.signal(signal.SIGINT, report)
print("ready", flush=True)
time.sleep(600)
"""


def test_a_server_stops_without_its_quota(tmp_path):
    # A stop is not measured; under the arm's quota it only takes longer.
    with ready_server(
        tmp_path,
        QUOTA_REPORTING_SERVER,
        "quota",
        quota_cores=0.5,
        terminate_leader_only=True,
        stop_signal=signal.SIGINT,
    ) as server:
        assert server.group.quota_in_force()["cores"] == 0.5
    assert "quota at stop: null" in (tmp_path / "server.log").read_text()


def test_a_container_is_stopped_with_the_signal_its_plan_gives():
    container = ContainerOptions(
        "docker", "sha256:" + "0" * 64, None, True, None, (), ()
    )
    plan = process_plan(["python3", "-m", "sglang.launch_server"])
    for stop_signal in ("SIGINT", "SIGTERM"):
        planned = dataclasses.replace(
            plan, container=container, stop_signal=stop_signal
        )
        argv = run_command(planned, "serving-study-stop", "stop")
        assert argv[argv.index("--stop-signal") + 1] == stop_signal
        assert argv.index("--stop-signal") < argv.index("--")


# Like SGLang's stop: the main process kills its children, Python's resource
# tracker among them, and exits, so its spawn-context lock's named semaphore
# (/dev/shm/sem.mp-*) outlives the server.
SEMAPHORE_LEAVING_SERVER = """
import multiprocessing, os, signal, time
import psutil

def stop(signal_number, frame):
    for child in psutil.Process().children(recursive=True):
        child.kill()
    os._exit(0)

if __name__ == "__main__":
    signal.signal(signal.SIGINT, stop)
    lock = multiprocessing.get_context("spawn").Lock()
    print("ready", lock, flush=True)
    time.sleep(600)
"""


def semaphores() -> set[str]:
    return {path.name for path in Path("/dev/shm").glob("sem.mp-*")}


def test_a_stopped_server_leaves_no_named_semaphore(tmp_path):
    before = semaphores()
    # Another program's, unheld and older than the server: not the server's to remove.
    elsewhere = Path("/dev/shm") / f"sem.mp-test{os.getpid()}"
    elsewhere.write_bytes(b"\0" * 32)
    try:
        with ready_server(
            tmp_path,
            SEMAPHORE_LEAVING_SERVER,
            "semaphore",
            terminate_leader_only=True,
            stop_signal=signal.SIGINT,
        ) as server:
            made = semaphores() - before - {elsewhere.name}
            assert len(made) == 1, server.log_tail()
        assert semaphores() - before == {elsewhere.name}
        assert server.leaked_segments == []  # left by design, not a leak
    finally:
        elsewhere.unlink(missing_ok=True)
