"""The per-thread CPU reader, on real processes and on real /proc stat text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from study_helpers import prompted_child, thread_cpu_window

from serving_study.measure.thread_cpu import (
    CLOCK_TICKS_PER_SECOND,
    ThreadCpu,
    ThreadCpuSnapshot,
    parse_task_stat,
    read_thread_cpu,
    read_thread_run_time,
)

BEFORE_WINDOW_SPIN_S = 0.3
MAIN_SPIN_S = 0.2
WORKER_SPIN_S = 0.3
WORKERS = 2
# Counters are whole ticks (10 ms at 100 Hz), and a thread does a little work around
# its spin (starting, waking); CPU time, so a busy machine only makes it slower.
SLACK_S = 0.15
SETTLING_S = 0.005

# Spins for set amounts of its own CPU time: the main thread before the window and
# in it, then two threads it names "worker" (as an OpenMP team shares one name); the
# workers stay alive until told, so that the second snapshot still sees them.
SPINNING_CHILD = f"""
import ctypes, sys, threading, time

PR_SET_NAME = 15
spun = threading.Barrier({WORKERS} + 1)
release = threading.Event()

def spin_until(seconds):
    while time.thread_time() < seconds:
        pass

def worker():
    ctypes.CDLL(None).prctl(PR_SET_NAME, b"worker", 0, 0, 0)
    spin_until({WORKER_SPIN_S})
    spun.wait()
    release.wait()

spin_until({BEFORE_WINDOW_SPIN_S})
print("ready", flush=True)
sys.stdin.readline()
start = time.thread_time()
spin_until(start + {MAIN_SPIN_S})
for _ in range({WORKERS}):
    threading.Thread(target=worker).start()
spun.wait()
print("spun", flush=True)
sys.stdin.readline()
release.set()
"""


def seconds(ticks: int) -> float:
    return ticks / CLOCK_TICKS_PER_SECOND


def spinning_child(tmp_path: Path):
    """SPINNING_CHILD running, once it has spun before the window (it printed
    "ready"): a ``prompted_child``, killed on leaving."""
    script = tmp_path / "spinning_child.py"
    script.write_text(SPINNING_CHILD)
    return prompted_child([sys.executable, str(script)], "ready")


def test_window_splits_a_process_by_thread_and_name(tmp_path):
    with spinning_child(tmp_path) as child:
        before, after = thread_cpu_window(child, "spun", exit_timeout_s=30)

    usage = after.since(before)
    workers = [thread for thread in usage.threads if thread.name == "worker"]
    assert len(workers) == WORKERS  # started inside the window: counted from zero
    for worker in workers:
        assert WORKER_SPIN_S - SLACK_S <= worker.seconds <= WORKER_SPIN_S + SLACK_S
    by_name = usage.ticks_by_name()
    main_name = usage.main_thread.name
    assert main_name != "worker"
    assert set(by_name) == {main_name, "worker"}
    assert by_name["worker"] == sum(worker.ticks for worker in workers)

    assert usage.main_thread.thread_id == child.pid
    main_seconds = seconds(usage.main_thread_ticks)
    assert MAIN_SPIN_S - SLACK_S <= main_seconds <= MAIN_SPIN_S + SLACK_S
    worker_seconds = seconds(usage.other_threads_ticks)
    expected_worker_seconds = WORKERS * WORKER_SPIN_S
    assert abs(worker_seconds - expected_worker_seconds) <= WORKERS * SLACK_S
    assert 0.6 <= usage.other_threads_share <= 0.9  # 0.6 of 0.8 s spun by workers


def test_run_time_is_each_threads_cpu_time_in_nanoseconds(tmp_path):
    with spinning_child(tmp_path) as child:  # spun, now waits on its stdin
        ticks = read_thread_cpu(child.pid)
        run_time = read_thread_run_time(child.pid)

    assert set(run_time) == set(ticks.threads)
    assert run_time[child.pid] / 1e9 >= BEFORE_WINDOW_SPIN_S
    for thread_id, nanoseconds in run_time.items():
        # Ticks are the same time cut to whole ticks, read a moment earlier (the
        # child still runs until it blocks on its stdin).
        difference = nanoseconds / 1e9 - ticks.threads[thread_id].seconds
        assert 0 <= difference < 1 / CLOCK_TICKS_PER_SECOND + SETTLING_S


def test_stat_text_with_spaces_and_parentheses_in_the_name():
    # A real line of /proc/<pid>/task/<tid>/stat, its name set to "a) (b c".
    stat = (
        b"27839 (a) (b c) S 27838 27839 27839 0 -1 4194560 6610 115167 0 1 2 4 288 "
        b"82 20 0 1 0 1265583 5124096 977 18446744073709551615 94451302391808\n"
    )
    thread = parse_task_stat(27839, stat)
    assert thread == ThreadCpu(27839, "a) (b c", user_ticks=2, system_ticks=4)
    assert thread.seconds == 6 / CLOCK_TICKS_PER_SECOND


def test_reused_thread_id_counts_from_zero():
    earlier = ThreadCpuSnapshot(
        10, {10: ThreadCpu(10, "main", 5, 5), 11: ThreadCpu(11, "old", 400, 30)}
    )
    later = ThreadCpuSnapshot(
        10, {10: ThreadCpu(10, "main", 7, 6), 11: ThreadCpu(11, "new", 3, 1)}
    )
    usage = later.since(earlier)
    assert usage.threads == (ThreadCpu(10, "main", 2, 1), ThreadCpu(11, "new", 3, 1))


def test_snapshots_of_two_processes_do_not_subtract():
    with pytest.raises(ValueError, match="different processes: 1 and 2"):
        ThreadCpuSnapshot(2, {}).since(ThreadCpuSnapshot(1, {}))


def test_a_process_that_is_gone_is_reported():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its /proc directory is gone
    with pytest.raises(ProcessLookupError, match=f"no process {child.pid}"):
        read_thread_cpu(child.pid)
    with pytest.raises(ProcessLookupError, match=f"no process {child.pid}"):
        read_thread_run_time(child.pid)
