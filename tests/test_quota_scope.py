"""The quota on the main process alone: SGLang's model processes leave its group.

A fake server (a main process with a child titled like SGLang's scheduler, and a
grandchild under it) runs in a real cgroup; after start-up the runner moves the
titled child and its own children to a group without a quota. Needs root.
"""

import os
import sys
import time

import psutil
import pytest

from serving_study.launch.plan import process_plan
from serving_study.servers.local_runtime import LocalServer

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="cgroups are created by root only"
)

FAKE_SERVER = """
import multiprocessing, time

def grandchild():
    time.sleep(600)

def scheduler(titled):
    import setproctitle
    setproctitle.setproctitle("sglang::scheduler")
    multiprocessing.Process(target=grandchild, daemon=False).start()
    titled.set()
    time.sleep(600)

if __name__ == "__main__":
    titled = multiprocessing.Event()
    multiprocessing.Process(target=scheduler, args=(titled,)).start()
    titled.wait()
    print("ready", flush=True)
    time.sleep(600)
"""


def started_server(tmp_path, scope: str) -> LocalServer:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    plan = process_plan(
        [sys.executable, str(script)],
        0.5,
        timing="healthy",
        scope=scope,
        stop_leader_only=True,
    )
    server = LocalServer(
        plan, f"scope-test-{scope}-{os.getpid()}", tmp_path / "server.log"
    )
    server.start()
    deadline = time.monotonic() + 30
    while "ready" not in server.log_tail() and time.monotonic() < deadline:
        time.sleep(0.1)
    return server


def test_model_processes_leave_the_quota_and_the_main_process_stays(tmp_path):
    server = started_server(tmp_path, "main_process")
    try:
        tree = psutil.Process(server.pid).children(recursive=True)
        scheduler = next(p for p in tree if p.name() == "sglang::scheduler")
        grandchildren = [child.pid for child in scheduler.children()]
        server.settle_after_start()
        server.apply_quota()

        assert set(server.model_group.pids()) == {scheduler.pid, *grandchildren}
        assert server.pid in server.group.pids()
        assert scheduler.pid not in server.group.pids()
        assert server.group.quota_in_force()["cores"] == pytest.approx(0.5)
        assert server.model_group.quota_in_force()["cores"] is None
    finally:
        server.stop()
    for group in (server.group, server.model_group):
        assert not any(directory.exists() for directory in group.directories())
    assert not alive(scheduler.pid)


def alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for an init to reap it."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_whole_server_scope_moves_nothing(tmp_path):
    server = started_server(tmp_path, "server")
    try:
        server.settle_after_start()
        assert server.model_group is None and server.moved_model_pids == []
        assert len(server.group.pids()) >= 3
    finally:
        server.stop()


def test_a_server_without_model_processes_cannot_take_the_main_process_scope(
    tmp_path,
):
    script = tmp_path / "plain.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    server = LocalServer(
        process_plan([sys.executable, str(script)], 0.5, scope="main_process"),
        f"scope-test-plain-{os.getpid()}",
        tmp_path / "server.log",
    )
    server.start()
    try:
        with pytest.raises(RuntimeError, match="no sglang::\\* model processes"):
            server.settle_after_start()
    finally:
        server.stop()
