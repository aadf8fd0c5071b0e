"""One measurement at a time per host: the lock a run holds, and its settings.

Each test uses its own lock file, so that pipelines really measuring on this
host are neither blocked nor let through by the tests.
"""

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from serving_study.measure.host_sharing import HostBusy, HostSharing, MeasurementLock

HOLDER = """
import sys
from serving_study.measure.host_sharing import HostSharing, MeasurementLock
sharing = HostSharing.from_config({"lock_file": sys.argv[1]})
lock = MeasurementLock.acquire(sharing, "experiment other, arm A, run 1")
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin
lock.release()
"""


def sharing(tmp_path: Path, **settings) -> HostSharing:
    lock_file = str(tmp_path / "measurement.lock")
    return HostSharing.from_config({"lock_file": lock_file} | settings)


@pytest.fixture
def other_pipeline(tmp_path):
    """Another process holding the lock until the test lets it go."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "measurement.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    yield holder
    if holder.poll() is None:
        holder.kill()
    holder.wait()


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
