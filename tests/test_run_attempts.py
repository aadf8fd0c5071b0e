"""A re-measure never destroys a valid run: each attempt is kept in a folder of its
own, and the run's outputs are copies of the attempt that counts.

The attempts here are real folders of real files, written as the arm runner writes
them; only their metrics are chosen by the test."""

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from serving_study.config.records import HostSharing
from serving_study.measure import run_attempts
from serving_study.measure.host_sharing import HostBusy, MeasurementLock
from serving_study.measure.run_attempts import RunAttempts, measure_attempt
from serving_study.measure.run_outputs import RunPaths

SETTINGS = "a" * 64


def attempts_of(tmp_path: Path, settings: str = SETTINGS) -> RunAttempts:
    run = tmp_path / "results/exp/A/run1"
    return RunAttempts(
        root=tmp_path / "results/exp/attempts/A/run1",
        outputs=RunPaths.in_directory(run),
        listing=run / "attempts.json",
        settings_sha256=settings,
    )


def metrics(valid: bool, throughput: float, outside_the_arm: bool = False) -> dict:
    reasons = [] if valid else ["the host's other load was 1.6 cores"]
    return {
        "valid": valid,
        "throughput_rps": throughput,
        "invalid_reasons": reasons,
        "outside_the_arm": outside_the_arm,
    }


def measured(paths: RunPaths, figures: dict) -> dict:
    """What the arm runner leaves in an attempt's folder."""
    paths.metrics.write_text(json.dumps(figures))
    paths.requests.write_text(f'{{"index": 0, "rps": {figures["throughput_rps"]}}}\n')
    paths.monitors.write_text("{}\n")
    paths.provenance.write_text(json.dumps({"pid": os.getpid()}))
    paths.server_log.write_text("served\n")
    return figures


def attempt(attempts: RunAttempts, figures: dict) -> dict:
    started = attempts.begin()
    attempts.keep(started, measured(started.paths, figures), waited_for_quiet_s=0)
    return attempts.choose(started, figures)


def outputs(attempts: RunAttempts) -> dict[str, bytes]:
    run = attempts.outputs.metrics.parent
    return {path.name: path.read_bytes() for path in sorted(run.iterdir())}


def run_files(attempts: RunAttempts) -> dict[str, bytes]:
    return {k: v for k, v in outputs(attempts).items() if k != "attempts.json"}


def forced_rerun(attempts: RunAttempts) -> None:
    """What Snakemake does before a job it runs again: delete its outputs."""
    for path in attempts.outputs.metrics.parent.iterdir():
        path.unlink()


def listing(attempts: RunAttempts) -> list[tuple[str, bool]]:
    entries = json.loads(attempts.listing.read_text())
    return [(entry["outcome"], entry["valid"]) for entry in entries]


def test_a_first_attempt_is_the_run(tmp_path):
    attempts = attempts_of(tmp_path)
    assert attempt(attempts, metrics(True, 10.0))["throughput_rps"] == 10.0
    assert json.loads(attempts.outputs.metrics.read_text())["throughput_rps"] == 10.0
    assert listing(attempts) == [("current", True)]


def test_a_valid_re_measure_supersedes_the_earlier_run_and_keeps_it(tmp_path):
    attempts = attempts_of(tmp_path)
    attempt(attempts, metrics(True, 10.0))
    forced_rerun(attempts)
    attempt(attempts, metrics(True, 12.0))
    assert json.loads(attempts.outputs.metrics.read_text())["throughput_rps"] == 12.0
    assert listing(attempts) == [("superseded", True), ("current", True)]
    kept = sorted(p for p in attempts.root.iterdir() if p.is_dir())
    assert json.loads((kept[0] / "metrics.json").read_text())["throughput_rps"] == 10


def test_a_re_measure_spoiled_by_the_host_gives_the_earlier_run_back_byte_for_byte(
    tmp_path,
):
    attempts = attempts_of(tmp_path)
    attempt(attempts, metrics(True, 10.0))
    before = run_files(attempts)
    forced_rerun(attempts)
    published = attempt(attempts, metrics(False, 3.0, outside_the_arm=True))
    assert published["valid"] and run_files(attempts) == before
    assert listing(attempts) == [("current", True), ("failed outside the arm", False)]
    # A later valid attempt supersedes the earlier one; the failed one stays failed.
    forced_rerun(attempts)
    attempt(attempts, metrics(True, 11.0))
    assert listing(attempts) == [
        ("superseded", True),
        ("failed outside the arm", False),
        ("current", True),
    ]


def test_an_invalid_attempt_of_the_arms_own_making_is_the_run(tmp_path):
    attempts = attempts_of(tmp_path)
    attempt(attempts, metrics(True, 10.0))
    forced_rerun(attempts)
    attempt(attempts, metrics(False, 3.0, outside_the_arm=False))
    assert not json.loads(attempts.outputs.metrics.read_text())["valid"]
    assert listing(attempts) == [("superseded", True), ("current", False)]


def test_an_earlier_run_of_other_settings_is_never_given_back(tmp_path):
    attempt(attempts_of(tmp_path, "a" * 64), metrics(True, 10.0))
    changed = attempts_of(tmp_path, "b" * 64)
    forced_rerun(changed)
    attempt(changed, metrics(False, 3.0, outside_the_arm=True))
    assert not json.loads(changed.outputs.metrics.read_text())["valid"]
    assert not changed.give_back_earlier("busy")


def test_a_dead_runners_partial_attempt_is_removed_by_the_next(tmp_path):
    attempts = attempts_of(tmp_path)
    killed = attempts.begin()
    killed.paths.server_log.write_text("the killed run's server\n")
    attempt(attempts, metrics(True, 10.0))
    assert not killed.directory.exists()
    assert b"killed" not in b"".join(outputs(attempts).values())
    assert [
        p.name for p in attempts.root.iterdir() if p.name.endswith(".partial")
    ] == []


def hold_lock(path: str, held, release) -> None:
    sharing = HostSharing.from_config({"lock_file": path})
    with MeasurementLock.acquire(sharing, "another pipeline's run"):
        held.set()
        release.wait(30)


@pytest.fixture
def busy_host(tmp_path):
    """The host's measurement lock, held by another process."""
    path = str(tmp_path / "measurement.lock")
    held, release = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(target=hold_lock, args=(path, held, release))
    holder.start()
    assert held.wait(30)
    yield HostSharing.from_config({"lock_file": path, "lock": "fail"})
    release.set()
    holder.join(30)


def test_a_host_that_stays_busy_gives_the_earlier_run_back(tmp_path, busy_host):
    attempts = attempts_of(tmp_path)
    attempt(attempts, metrics(True, 10.0))
    before = run_files(attempts)
    forced_rerun(attempts)
    never = []
    published = measure_attempt(
        attempts, busy_host, "a re-measure", lambda paths, lock: never.append(paths)
    )
    assert never == [] and published["throughput_rps"] == 10.0
    assert run_files(attempts) == before


def test_a_busy_host_without_an_earlier_run_fails_the_job(tmp_path, busy_host):
    attempts = attempts_of(tmp_path)
    with pytest.raises(HostBusy):
        measure_attempt(attempts, busy_host, "a first run", lambda paths, lock: {})
    assert not attempts.outputs.metrics.exists()


def test_an_attempt_measures_in_a_fresh_folder_under_the_hosts_lock(tmp_path):
    attempts = attempts_of(tmp_path)
    sharing = HostSharing.from_config({"lock_file": str(tmp_path / "m.lock")})
    seen = {}

    def measure(paths: RunPaths, lock: MeasurementLock) -> dict:
        seen["folder"] = paths.metrics.parent.name
        seen["held"] = lock.record["lock_file"]
        return measured(paths, metrics(True, 9.0))

    assert measure_attempt(attempts, sharing, "a run", measure)["valid"]
    assert seen["folder"].endswith(".partial")
    assert seen["held"] == str(tmp_path / "m.lock")


# --- Retries after a busy minute ----------------------------------------------------


def retrying(tmp_path, monkeypatch, quiet: bool, retries: int = 2) -> HostSharing:
    """Settings that retry, with a host that is (or never becomes) quiet at once."""
    waits = []

    def wait_for_quiet_host(sharing):
        waits.append(sharing.quiet_for_s)
        return {"quiet": quiet, "waited_s": 4.5, "last_window": {}}

    monkeypatch.setattr(run_attempts, "wait_for_quiet_host", wait_for_quiet_host)
    return HostSharing.from_config(
        {"lock_file": str(tmp_path / "m.lock"), "retries": retries}
    )


def measuring(*figures: dict):
    """A measure that returns ``figures`` in turn, one per attempt."""
    queue = list(figures)
    return lambda paths, lock: measured(paths, queue.pop(0))


def tries(attempts: RunAttempts) -> list[tuple[str, bool, float]]:
    entries = json.loads(attempts.listing.read_text())
    assert len({entry["job"] for entry in entries}) == 1
    return [(e["outcome"], e["valid"], e["waited_for_quiet_s"]) for e in entries]


def test_a_run_spoiled_by_the_host_is_tried_again_once_the_host_is_quiet(
    tmp_path, monkeypatch
):
    attempts = attempts_of(tmp_path)
    sharing = retrying(tmp_path, monkeypatch, quiet=True)
    busy, good = metrics(False, 3.0, outside_the_arm=True), metrics(True, 10.0)
    published = measure_attempt(attempts, sharing, "a run", measuring(busy, good))
    assert published["valid"] and published["throughput_rps"] == 10.0
    assert tries(attempts) == [
        ("failed outside the arm", False, 0),
        ("current", True, 4.5),
    ]


def test_retries_end_at_the_configured_count(tmp_path, monkeypatch):
    attempts = attempts_of(tmp_path)
    sharing = retrying(tmp_path, monkeypatch, quiet=True, retries=1)
    busy = metrics(False, 3.0, outside_the_arm=True)
    published = measure_attempt(
        attempts, sharing, "a run", measuring(busy, busy, metrics(True, 9.0))
    )
    assert not published["valid"]
    assert [outcome for outcome, _, _ in tries(attempts)] == [
        "failed outside the arm",
        "current",
    ]


def test_a_host_that_never_quiets_down_gets_no_more_tries(tmp_path, monkeypatch):
    attempts = attempts_of(tmp_path)
    sharing = retrying(tmp_path, monkeypatch, quiet=False)
    busy = metrics(False, 3.0, outside_the_arm=True)
    measure_attempt(attempts, sharing, "a run", measuring(busy, metrics(True, 9.0)))
    assert [outcome for outcome, _, _ in tries(attempts)] == ["current"]


def test_a_run_invalid_for_the_arms_own_reasons_is_not_tried_again(
    tmp_path, monkeypatch
):
    attempts = attempts_of(tmp_path)
    sharing = retrying(tmp_path, monkeypatch, quiet=True)
    own = metrics(False, 3.0, outside_the_arm=False)
    measure_attempt(attempts, sharing, "a run", measuring(own, metrics(True, 9.0)))
    assert tries(attempts) == [("current", False, 0)]


# --- A runner whose Snakemake is killed outright ------------------------------------

WATCHED_CHILD = """
import signal, sys, time
from serving_study.servers.parent_death import terminated_with_parent

def torn_down(number, frame):
    print("torn down", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, torn_down)
terminated_with_parent()
print("watching", flush=True)
time.sleep(60)
print("never told", flush=True)
"""

PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=sys.stdout)
print(child.pid, flush=True)
child.wait()
"""


def test_a_runner_is_told_when_its_parent_is_killed_outright(tmp_path):
    output = tmp_path / "child.out"
    with output.open("w") as sink:
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT, WATCHED_CHILD], stdout=sink
        )
        deadline = time.monotonic() + 60
        while "watching" not in output.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(output.read_text().split()[0])
        parent.kill()  # SIGKILL: the parent runs nothing of its own
        parent.wait()
        while psutil.pid_exists(child) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert output.read_text().split("\n")[1:3] == ["watching", "torn down"]
