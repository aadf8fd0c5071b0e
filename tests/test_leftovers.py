"""A runner killed outright leaves nothing that lasts.

Its server dies with it (parent-death signal), a container's watchdog removes
the container, and what is left (cgroups, containers, shared-memory segments)
is found by its dead owner and removed by the next sweep; what a live process
owns is never touched. Real processes, real cgroups (root) and real files.
"""

import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from study_helpers import needs_cgroups, snakemake_command

from serving_study.servers.cgroups import (
    CpuQuotaGroup,
    project_group_directories,
    wrap_command,
)
from serving_study.servers.leftovers import (
    Reaped,
    reap_containers,
    reap_groups,
    reap_leftovers,
    reap_segments,
)
from serving_study.servers.owners import (
    alive,
    owned_name,
    owner_alive,
    owner_of,
    owner_token,
)
from serving_study.servers.shared_memory import record_owned


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def wait_until(condition, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def started_parent(script: str, *arguments: str) -> tuple[subprocess.Popen, str]:
    """A Python parent running ``script``; returns it and its first output line."""
    parent = subprocess.Popen(
        [sys.executable, "-c", script, *arguments],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = parent.stdout.readline().strip()
    assert line, "the parent printed nothing"
    return parent, line


def kill(parent: subprocess.Popen) -> None:
    parent.send_signal(signal.SIGKILL)
    parent.wait()


# --- Owners ----------------------------------------------------------------------


def test_the_owner_is_read_back_past_the_suffixes_a_run_adds():
    name = owned_name("exp-A-run1", owner="4321.77.4026531836")
    assert owner_of(name) == "4321.77.4026531836"
    assert owner_of(f"{name}-try2") == "4321.77.4026531836"
    assert owner_of(f"{name}-try2-model") == "4321.77.4026531836"
    # An arm or experiment that happens to be called owner<N> comes before it.
    assert owner_of(owned_name("owner7-owner8-run1", owner="99") + "-try1") == "99"
    assert owned_name("x").endswith(f"-owner{owner_token()}")


def test_an_owner_is_its_process_not_its_pid_and_only_of_our_namespace():
    mine = owner_token()
    pid, start, namespace = mine.split(".")
    assert owner_alive(mine)
    # The pid reused by another process: another start time.
    assert not owner_alive(f"{pid}.{int(start) + 1}.{namespace}")
    assert not owner_alive(f"{dead_pid()}.{start}.{namespace}")
    # A pipeline in another pid namespace is not ours to judge: never removed.
    assert owner_alive(f"{dead_pid()}.{start}.{int(namespace) + 1}")


def test_names_without_an_owner_mark_have_no_owner():
    # Numbers alone are not owners: a test's uuid suffix may be all digits.
    for name in ("test-12345678", "preflight-12", "scope-test-server-77", "owner"):
        assert owner_of(name) is None


def test_a_zombie_or_an_exited_process_is_not_alive():
    assert alive(os.getpid())
    assert not alive(dead_pid())
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_until(lambda: psutil.Process(zombie.pid).status() == "zombie")
    assert not alive(zombie.pid)
    zombie.wait()


# --- Segments ----------------------------------------------------------------------


@pytest.fixture
def shm_dir():
    """A directory on /dev/shm's own tmpfs (the kernel reports mappings there by
    the file's own device and inode), standing in for /dev/shm itself."""
    directory = Path("/dev/shm") / f"serving-study-test-{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    yield directory
    shutil.rmtree(directory)


def test_only_what_a_dead_runners_ledger_names_and_nobody_holds_is_unlinked(
    shm_dir,
):
    gone = dead_pid()
    names = {
        "its server's segment": f"sgl_shm_mm_{gone}_0a1b2c3d",
        "another SGLang's segment": f"sgl_shm_mm_{dead_pid()}_0a1b2c3d",
        "its semaphore": "sem.mp-unheld1",
        "its semaphore still open": "sem.mp-open1",
        "its semaphore still mapped": "sem.mp-mapped1",
        "its load report": "sglang_loads_default_1234abcd.shm",
        "another program's semaphore": "sem.mp-other1",
        "a live runner's load report": "sglang_loads_default_live.shm",
        "python's unnamed segment": "psm_0a1b2c3d",
    }
    for name in names.values():
        (shm_dir / name).write_bytes(b"\0" * 4096)
    made = {shm_dir / names[what] for what in names if what.startswith("its ")}
    namespace = owner_token().split(".")[2]
    record_owned("dead-run", f"{gone}.1.{namespace}", {gone}, made, shm_dir)
    record_owned("live-run", owner_token(), {os.getpid()}, set(), shm_dir)
    # Held by a live process: open, or only mapped (the descriptor closed).
    opened = open(shm_dir / names["its semaphore still open"], "rb")
    with open(shm_dir / names["its semaphore still mapped"], "r+b") as file:
        mapped = mmap.mmap(file.fileno(), 4096)
    try:
        reaped = Reaped()
        reap_segments(shm_dir, reaped)
    finally:
        opened.close()
        mapped.close()
    removed = {"its server's segment", "its semaphore", "its load report"}
    assert sorted(reaped.segments) == sorted(names[what] for what in removed)
    left = {path.name for path in shm_dir.iterdir()}
    kept = {name for what, name in names.items() if what not in removed}
    # The dead run's ledger stays: two files it names are still held.
    ledgers = {"serving-study-owned-live-run.json", "serving-study-owned-dead-run.json"}
    assert left == kept | ledgers
    reap_segments(shm_dir, Reaped())
    assert not (shm_dir / names["its semaphore still open"]).exists()
    assert not (shm_dir / "serving-study-owned-dead-run.json").exists()


def test_a_dead_creators_segment_still_mapped_by_a_live_process_stays(shm_dir):
    """A scheduler still reading it, or a container's pid that means another
    process here: the mapping is what counts."""
    gone = dead_pid()
    name = f"sgl_shm_mm_{gone}_0a1b2c3d"
    (shm_dir / name).write_bytes(b"\0" * 4096)
    namespace = owner_token().split(".")[2]
    record_owned("dead-run", f"{gone}.1.{namespace}", {gone}, set(), shm_dir)
    with open(shm_dir / name, "r+b") as file:
        mapped = mmap.mmap(file.fileno(), 4096)
    try:
        reaped = Reaped()
        reap_segments(shm_dir, reaped)
    finally:
        mapped.close()
    assert reaped.segments == []
    assert (shm_dir / name).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="hands a file to another user")
def test_a_ledger_another_user_wrote_or_a_name_with_a_path_steers_nothing(shm_dir):
    """/dev/shm is open to every user: a planted ledger must not make root unlink."""
    gone = dead_pid()
    namespace = owner_token().split(".")[2]
    victim = shm_dir / "sem.mp-victim"
    victim.write_bytes(b"\0")
    outside = shm_dir / "outside"
    outside.mkdir()
    (outside / "kept").write_bytes(b"\0")
    record_owned("planted", f"{gone}.1.{namespace}", {gone}, {victim}, shm_dir)
    os.chown(shm_dir / "serving-study-owned-planted.json", 65534, 65534)
    ours = {"owner": f"{gone}.1.{namespace}", "pids": [], "names": ["../outside/kept"]}
    (shm_dir / "serving-study-owned-ours.json").write_text(json.dumps(ours))
    reaped = Reaped()
    reap_segments(shm_dir, reaped)
    assert reaped.segments == []
    assert victim.exists() and (outside / "kept").exists()


# --- Cgroups and servers (root) ------------------------------------------------------


@needs_cgroups
def test_a_dead_owners_group_is_emptied_and_removed_a_live_owners_kept():
    dead = CpuQuotaGroup.create(
        owned_name(f"reap-{uuid.uuid4().hex[:8]}", str(dead_pid())), None
    )
    live = CpuQuotaGroup.create(owned_name(f"reap-{uuid.uuid4().hex[:8]}"), None)
    straggler = subprocess.Popen(wrap_command(dead, ["sleep", "600"]))
    try:
        assert wait_until(lambda: straggler.pid in dead.pids())
        reaped = Reaped()
        reap_groups(reaped)
        assert str(dead.cpu_directory) in reaped.cgroups
        assert straggler.pid in reaped.processes
        assert straggler.wait(timeout=30) == -signal.SIGKILL
        assert not any(directory.exists() for directory in dead.directories())
        assert str(live.cpu_directory) not in reaped.cgroups
        assert live.cpu_directory.exists()
    finally:
        if straggler.poll() is None:
            straggler.kill()
            straggler.wait()
        dead.remove()
        live.remove()


RUNNER = """
import json, os, sys, time
from pathlib import Path
from serving_study.launch.plan import process_plan
from serving_study.servers.local_runtime import LocalServer
from serving_study.servers.owners import owned_name

server = LocalServer(
    process_plan(["sleep", "600"], 0.5), owned_name("killed-runner"), Path(sys.argv[1])
)
server.start()
print(json.dumps({"server": server.pid, "group": str(server.group.cpu_directory)}),
      flush=True)
time.sleep(600)
"""


@needs_cgroups
def test_a_killed_runners_server_dies_with_it_and_its_group_is_reaped(tmp_path):
    runner, line = started_parent(RUNNER, str(tmp_path / "server.log"))
    started = json.loads(line)
    group = Path(started["group"])
    try:
        assert psutil.pid_exists(started["server"])
        kill(runner)
        # The parent-death signal: no teardown ran, yet the server is gone.
        assert wait_until(lambda: not alive(started["server"]))
        assert group.exists(), "nothing but the sweep removes the dead run's group"
        assert group in project_group_directories()
        reaped = reap_leftovers()
        assert str(group) in reaped.cgroups
        assert not group.exists()
    finally:
        if runner.poll() is None:
            kill(runner)
        if alive(started["server"]):
            os.kill(started["server"], signal.SIGKILL)


# --- Containers (a stand-in runtime that records what it is asked) -----------------

FAKE_RUNTIME = """#!/bin/sh
echo "$@" >> "{calls}"
case "$1" in
  ps) printf 'c1\\nc2\\n' ;;
  inspect) printf 'c1 {dead} /serving-study-exp-A-run1-owner{dead}-try1\\n'
           printf 'c2 {live} /serving-study-exp-B-run1-owner{live}-try1\\n' ;;
esac
"""


def fake_runtime(tmp_path: Path, dead: str, live: str) -> tuple[str, Path]:
    calls = tmp_path / "calls.txt"
    runtime = tmp_path / "fake-docker"
    runtime.write_text(FAKE_RUNTIME.format(calls=calls, dead=dead, live=live))
    runtime.chmod(0o755)
    return str(runtime), calls


def test_only_containers_whose_runner_is_gone_are_removed(tmp_path):
    gone = f"{dead_pid()}.1.{owner_token().split('.')[2]}"
    runtime, calls = fake_runtime(tmp_path, gone, owner_token())
    reaped = Reaped()
    reap_containers(runtime, reaped)
    assert reaped.containers == [f"serving-study-exp-A-run1-owner{gone}-try1"]
    removals = [
        line for line in calls.read_text().splitlines() if line.startswith("rm")
    ]
    assert removals == ["rm --force --volumes -- c1"]
    assert reaped.problems == []


def test_a_runtime_that_does_not_answer_is_a_problem_not_an_error(tmp_path):
    reaped = Reaped()
    reap_containers(str(tmp_path / "no-such-runtime"), reaped)
    assert reaped.containers == []
    assert len(reaped.problems) == 1


WATCHED = """
import sys, time
from serving_study.servers.container_watchdog import watch
watchdog = watch(sys.argv[1], "container-under-watch", sys.argv[2])
print(watchdog.pid, flush=True)
time.sleep(600)
"""

# Refuses the first two removals, as a daemon busy with the container would.
REFUSING_RUNTIME = """#!/bin/sh
echo "$@" >> "{calls}"
[ "$(wc -l < "{calls}")" -le 2 ] || exit 0
echo "Error response from daemon: removal of container $6 is already in progress" >&2
exit 1
"""


def test_the_watchdog_removes_the_container_when_its_runner_is_killed(tmp_path):
    runtime, calls = fake_runtime(tmp_path, 1, 1)
    runner, watchdog_pid = started_parent(WATCHED, runtime, str(tmp_path / "log"))
    try:
        time.sleep(0.5)
        assert not calls.exists(), "the watchdog acts only once the runner is gone"
        kill(runner)
        assert wait_until(calls.exists)
        assert calls.read_text().splitlines() == [
            "rm --force --volumes -- container-under-watch"
        ]
        assert wait_until(lambda: not alive(int(watchdog_pid)))
    finally:
        if runner.poll() is None:
            kill(runner)


def test_a_watchdog_refused_removes_again_and_logs_each_refusal(tmp_path):
    calls = tmp_path / "calls.txt"
    runtime = tmp_path / "refusing-docker"
    runtime.write_text(REFUSING_RUNTIME.format(calls=calls))
    runtime.chmod(0o755)
    log = tmp_path / "server.log"
    runner, watchdog_pid = started_parent(WATCHED, str(runtime), str(log))
    try:
        kill(runner)
        assert wait_until(lambda: calls.exists() and len(lines(calls)) == 3, 30)
        assert set(lines(calls)) == {"rm --force --volumes -- container-under-watch"}
        refusals = lines(log)
        assert len(refusals) == 2
        assert all("already in progress" in refusal for refusal in refusals)
        assert wait_until(lambda: not alive(int(watchdog_pid)))
    finally:
        if runner.poll() is None:
            kill(runner)


# Takes half a second to remove, as a daemon stopping a container does.
SLOW_RUNTIME = """#!/bin/sh
sleep 0.5
echo "$@" >> "{calls}"
"""


def test_a_watchdog_finishes_its_removal_when_signalled_again(tmp_path):
    """A dying runner's threads exit one after another, and the kernel sends the
    parent-death signal again each time the watchdog passes to the next: the
    removal must survive those later SIGTERMs."""
    from serving_study.servers.container_watchdog import watch

    calls = tmp_path / "calls.txt"
    runtime = tmp_path / "slow-docker"
    runtime.write_text(SLOW_RUNTIME.format(calls=calls))
    runtime.chmod(0o755)
    watchdog = watch(str(runtime), "container-under-watch", tmp_path / "log")
    time.sleep(0.5)  # the watchdog waits for its signal
    watchdog.send_signal(signal.SIGTERM)
    time.sleep(0.2)  # the removal under way
    watchdog.send_signal(signal.SIGTERM)
    assert watchdog.wait(timeout=30) == 0
    assert lines(calls) == ["rm --force --volumes -- container-under-watch"]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_a_watchdog_stopped_by_its_runner_removes_nothing(tmp_path):
    from serving_study.servers.container_watchdog import stop, watch

    runtime, calls = fake_runtime(tmp_path, 1, 1)
    watchdog = watch(runtime, "container-under-watch", tmp_path / "log")
    stop(watchdog)
    assert watchdog.returncode == -signal.SIGKILL
    assert not calls.exists()


@needs_cgroups
def test_the_cleanup_target_removes_a_dead_runs_group_on_demand(tmp_path):
    name = owned_name(f"cleanup-{uuid.uuid4().hex[:8]}", str(dead_pid()))
    dead = CpuQuotaGroup.create(name, None)
    try:
        finished = subprocess.run(
            snakemake_command(tmp_path, "--cores", "1", "cleanup"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert finished.returncode == 0, finished.stderr[-3000:]
        assert "removed: " in finished.stdout
        assert not any(directory.exists() for directory in dead.directories())
    finally:
        dead.remove()
