"""One measurement at a time per host: the lock a run holds, and its settings.

A measurement holds the lock exclusively, preparation holds it shared. Each test
uses its own lock file, so that pipelines really measuring on this host are
neither blocked nor let through by the tests.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from serving_study.measure.host_sharing import (
    HostBusy,
    HostSharing,
    MeasurementLock,
    UnsafeLockFile,
    preparation_lock,
)

ROOT = Path(__file__).resolve().parents[1]

HOLDER = """
import sys
from serving_study.measure.host_sharing import HostSharing, MeasurementLock
sharing = HostSharing.from_config({"lock_file": sys.argv[1]})
shared = sys.argv[2] == "shared"
holder = "experiment other, " + ("make_workload" if shared else "arm A, run 1")
lock = MeasurementLock.acquire(sharing, holder, shared=shared)
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin
lock.release()
"""

# Runs a workflow script as Snakemake would, with the few fields of its
# ``snakemake`` object the script reads.
SCRIPT_JOB = """
import json, runpy, sys
from types import SimpleNamespace
job = json.loads(sys.argv[2])
snakemake = SimpleNamespace(
    log=[job["log"]],
    output=SimpleNamespace(**job["output"]),
    params=SimpleNamespace(**job["params"]),
    config=job["config"],
)
runpy.run_path(sys.argv[1], init_globals={"snakemake": snakemake})
"""


def sharing(tmp_path: Path, **settings) -> HostSharing:
    lock_file = str(tmp_path / "measurement.lock")
    return HostSharing.from_config({"lock_file": lock_file} | settings)


def hold_lock(tmp_path: Path, mode: str):
    """Another process holding the lock (``exclusive`` or ``shared``) until the
    test closes its stdin."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "measurement.lock"), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


@pytest.fixture
def other_pipeline(tmp_path):
    """Another pipeline's run, measuring."""
    yield from hold_lock(tmp_path, "exclusive")


@pytest.fixture
def other_preparation(tmp_path):
    """Another pipeline's preparation job."""
    yield from hold_lock(tmp_path, "shared")


class Announced(logging.Handler):
    """Set once the lock logs that a caller waits for it."""

    def __init__(self):
        super().__init__()
        self.waiting = threading.Event()

    def emit(self, record):
        if "waits for the host's measurement lock" in record.getMessage():
            self.waiting.set()


@pytest.fixture
def announced():
    handler = Announced()
    logger = logging.getLogger("serving_study.measure.host_sharing")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    yield handler
    logger.setLevel(previous)
    logger.removeHandler(handler)


def test_fail_mode_refuses_at_once_and_names_the_holder(tmp_path, other_pipeline):
    with pytest.raises(HostBusy) as refused:
        MeasurementLock.acquire(sharing(tmp_path, lock="fail"), "experiment mine")
    message = str(refused.value)
    assert f"pid {other_pipeline.pid}" in message
    assert "experiment other, arm A, run 1" in message
    assert "host_sharing.lock is 'fail'" in message


def test_wait_mode_waits_for_the_holder_then_measures(tmp_path, other_pipeline):
    taken = []
    waiter = threading.Thread(
        target=lambda: taken.append(
            MeasurementLock.acquire(sharing(tmp_path), "experiment mine")
        )
    )
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive(), "it must wait while the other pipeline measures"
    other_pipeline.stdin.close()  # the other run is torn down
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    lock = taken[0]
    try:
        assert f"pid {other_pipeline.pid}" in lock.record["waited_for"]
        holder = json.loads((tmp_path / "measurement.lock").read_text())
        assert holder["holder"] == "experiment mine"
    finally:
        lock.release()
    assert (tmp_path / "measurement.lock").read_text() == ""


def test_wait_mode_gives_up_after_the_configured_wait(tmp_path, other_pipeline):
    with pytest.raises(HostBusy, match="longer than host_sharing.lock_wait_s"):
        MeasurementLock.acquire(sharing(tmp_path, lock_wait_s=0.5), "experiment mine")


def test_a_killed_holder_leaves_the_host_free(tmp_path, other_pipeline):
    other_pipeline.send_signal(signal.SIGKILL)
    other_pipeline.wait()
    lock = MeasurementLock.acquire(sharing(tmp_path, lock="fail"), "experiment mine")
    lock.release()


def test_one_process_cannot_take_the_lock_twice(tmp_path):
    """Every run opens the file anew: two runs in one process exclude each other."""
    with MeasurementLock.acquire(sharing(tmp_path), "first"):
        with pytest.raises(HostBusy):
            MeasurementLock.acquire(sharing(tmp_path, lock="fail"), "second")
    MeasurementLock.acquire(sharing(tmp_path, lock="fail"), "third").release()


def test_a_link_planted_at_the_lock_path_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "measurement.lock").symlink_to(victim)
    with pytest.raises(OSError):
        MeasurementLock.acquire(sharing(tmp_path), "experiment mine")
    assert victim.read_text() == "precious"


def test_preparations_share_the_lock_and_leave_no_record(tmp_path, other_preparation):
    with preparation_lock(sharing(tmp_path, lock="fail"), "make_workload mine") as lock:
        assert lock.record["waited_for"] is None
        assert (tmp_path / "measurement.lock").read_text() == ""
    assert (tmp_path / "measurement.lock").read_text() == ""


def test_a_measurement_waits_for_preparation_then_measures(
    tmp_path, other_preparation, announced
):
    with pytest.raises(HostBusy) as refused:
        MeasurementLock.acquire(sharing(tmp_path, lock="fail"), "experiment mine")
    assert "preparation jobs (the lock is held shared" in str(refused.value)

    taken = []
    waiter = threading.Thread(
        target=lambda: taken.append(
            MeasurementLock.acquire(sharing(tmp_path), "experiment mine")
        )
    )
    waiter.start()
    assert announced.waiting.wait(timeout=60)
    assert waiter.is_alive(), "it must wait while another pipeline prepares"
    other_preparation.stdin.close()  # the preparation job is done
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    with taken[0] as lock:
        assert lock.record["waited_for"].startswith("preparation jobs")
        holder = json.loads((tmp_path / "measurement.lock").read_text())
        assert holder["holder"] == "experiment mine"


def test_preparation_fails_naming_the_measurement_it_would_disturb(
    tmp_path, other_pipeline
):
    with pytest.raises(HostBusy) as refused:
        preparation_lock(sharing(tmp_path, lock="fail"), "make_workload mine")
    message = str(refused.value)
    assert f"pid {other_pipeline.pid} (experiment other, arm A, run 1" in message
    assert "make_workload mine does not wait" in message


def test_a_dead_runs_record_is_cleared_by_the_next_preparation(
    tmp_path, other_pipeline
):
    other_pipeline.send_signal(signal.SIGKILL)
    other_pipeline.wait()
    assert "experiment other" in (tmp_path / "measurement.lock").read_text()
    with preparation_lock(sharing(tmp_path), "make_workload mine"):
        with pytest.raises(HostBusy) as refused:
            MeasurementLock.acquire(sharing(tmp_path, lock="fail"), "experiment mine")
    assert "experiment other" not in str(refused.value)
    assert "preparation jobs" in str(refused.value)


def test_a_second_studys_preparation_waits_while_the_first_measures(
    tmp_path, other_pipeline
):
    """The workflow's make_workload script, run as Snakemake runs it, does nothing
    while the first study's run holds the lock, then makes its workload."""
    workload = tmp_path / "second" / "workloads" / "tiny"
    workload.mkdir(parents=True)
    log_path = tmp_path / "second" / "make_workload.log"
    job = {
        "log": str(log_path),
        "output": {
            "manifest": str(workload / "manifest.json"),
            "images": str(workload / "images"),
        },
        "params": {
            "spec": {
                "name": "tiny",
                "seed": 3,
                "images": 2,
                "width": 64,
                "height": 64,
                "format": "png",
                "content": "noise",
                "input_tokens": 12,
            }
        },
        "config": {"host_sharing": {"lock_file": str(tmp_path / "measurement.lock")}},
    }
    preparation = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SCRIPT_JOB,
            str(ROOT / "scripts/make_workload.py"),
            json.dumps(job),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while "waits for the host's measurement lock" not in (
            log_path.read_text() if log_path.exists() else ""
        ):
            assert preparation.poll() is None, "it ran beside the measurement"
            assert time.monotonic() < deadline, "it never reached the lock"
            time.sleep(0.05)
        assert f"held by pid {other_pipeline.pid}" in log_path.read_text()
        assert list(workload.iterdir()) == [], "it started its work"

        released = time.time()
        other_pipeline.stdin.close()  # the first study's run is torn down
        _, errors = preparation.communicate(timeout=120)
    finally:
        if preparation.poll() is None:
            preparation.kill()
            preparation.wait()
    assert preparation.returncode == 0, errors
    manifest = json.loads((workload / "manifest.json").read_text())
    assert len(manifest["images"]) == 2
    assert (workload / "images").stat().st_mtime >= released


def test_the_lock_is_refused_where_another_user_could_make_it_first(tmp_path):
    shared = tmp_path / "everyone"
    shared.mkdir()
    shared.chmod(0o1777)  # as /run/lock itself: anyone may create a file there
    lock_file = str(shared / "measurement.lock")
    with pytest.raises(UnsafeLockFile, match="another user"):
        MeasurementLock.acquire(HostSharing.from_config({"lock_file": lock_file}), "a")
    assert not (shared / "measurement.lock").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_a_lock_file_another_user_made_is_refused(tmp_path):
    planted = tmp_path / "measurement.lock"
    planted.write_text("")
    os.chown(planted, 65534, 65534)  # nobody's
    with pytest.raises(UnsafeLockFile, match="belongs to another user"):
        MeasurementLock.acquire(sharing(tmp_path), "a")


def test_the_locks_folder_is_made_for_its_owner_alone(tmp_path):
    lock_file = tmp_path / "locks" / "serving-study" / "measurement.lock"
    settings = HostSharing.from_config({"lock_file": str(lock_file)})
    with MeasurementLock.acquire(settings, "a"):
        pass
    assert lock_file.parent.stat().st_mode & 0o777 == 0o755
    assert lock_file.stat().st_mode & 0o777 == 0o644
