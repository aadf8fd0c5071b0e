"""Where a process's CPU time goes, thread by thread, from /proc/<pid>/task/*.

Every per-thread reading of the project is made here, in one of three forms:

* `read_thread_cpu(pid)` takes a snapshot from each thread's ``stat``: its name (its
  ``comm``, as set with ``prctl(PR_SET_NAME)``; OpenMP workers keep the name of the
  thread that made them) and its user and system CPU time in clock ticks.
  `later.since(earlier)` gives the CPU each thread used in between, split into the
  main thread (the one whose id is the pid: a server's event loop) and the others
  (an intra-op OpenMP team, say).
* `read_thread_run_time(pid)` reads each thread's ``schedstat``: its CPU time in
  nanoseconds, without a name. Exact where ticks are coarse, and cheap enough for
  the run monitors to sample hundreds of threads once a second;
  `threads_that_ran` and `main_thread_split` compare two such readings.
* `read_thread_sleeps(pid)` reads how often each thread has gone to sleep (its
  voluntary context switches, from ``status``): a spinning thread never does.

The kernel keeps a thread's counters only while the thread exists: a thread that
ended between two readings is missing from the difference, and one that started in
between counts from zero.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass

CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ThreadCpu:
    """One thread's CPU time in clock ticks: since it started, or over a window."""

    thread_id: int
    name: str
    user_ticks: int
    system_ticks: int

    @property
    def ticks(self) -> int:
        return self.user_ticks + self.system_ticks

    @property
    def seconds(self) -> float:
        return self.ticks / CLOCK_TICKS_PER_SECOND


@dataclass(frozen=True)
class ThreadCpuUsage:
    """The CPU each thread of process `pid` used between two snapshots."""

    pid: int
    threads: tuple[ThreadCpu, ...]  # sorted by thread id; the main thread's is pid

    @property
    def main_thread(self) -> ThreadCpu | None:
        """The thread whose id is the pid; None once it has exited."""
        return next((t for t in self.threads if t.thread_id == self.pid), None)

    @property
    def main_thread_ticks(self) -> int:
        main = self.main_thread
        return 0 if main is None else main.ticks

    @property
    def other_threads_ticks(self) -> int:
        return self.total_ticks - self.main_thread_ticks

    @property
    def total_ticks(self) -> int:
        return sum(thread.ticks for thread in self.threads)

    @property
    def other_threads_share(self) -> float | None:
        """The other threads' part of the process's CPU; None when it used none."""
        total = self.total_ticks
        return self.other_threads_ticks / total if total else None

    def ticks_by_name(self) -> dict[str, int]:
        by_name: Counter[str] = Counter()
        for thread in self.threads:
            by_name[thread.name] += thread.ticks
        return dict(by_name)


@dataclass(frozen=True)
class ThreadCpuSnapshot:
    """Every thread of process `pid` and its CPU time so far, read at one moment."""

    pid: int
    threads: dict[int, ThreadCpu]  # by thread id

    def since(self, earlier: ThreadCpuSnapshot) -> ThreadCpuUsage:
        """The CPU each thread alive now used after `earlier` was read."""
        if earlier.pid != self.pid:
            raise ValueError(
                f"snapshots of different processes: {earlier.pid} and {self.pid}"
            )
        used = []
        for thread_id, now in sorted(self.threads.items()):
            before = earlier.threads.get(thread_id)
            # A counter that went backwards belongs to a new thread under a reused id.
            if (
                before is not None
                and before.user_ticks <= now.user_ticks
                and before.system_ticks <= now.system_ticks
            ):
                now = ThreadCpu(
                    thread_id,
                    now.name,
                    now.user_ticks - before.user_ticks,
                    now.system_ticks - before.system_ticks,
                )
            used.append(now)
        return ThreadCpuUsage(self.pid, tuple(used))


def parse_task_stat(thread_id: int, stat: bytes) -> ThreadCpu:
    """A thread's name and CPU ticks from the text of its /proc/.../stat file."""
    # The name sits in parentheses and may itself hold spaces and parentheses.
    name_start, name_end = stat.index(b"("), stat.rindex(b")")
    # After the name: state, then (counting from 0) utime at 11 and stime at 12.
    fields = stat[name_end + 2 :].split()
    return ThreadCpu(
        thread_id=thread_id,
        name=stat[name_start + 1 : name_end].decode(errors="replace"),
        user_ticks=int(fields[11]),
        system_ticks=int(fields[12]),
    )


def read_thread_cpu(pid: int) -> ThreadCpuSnapshot:
    """Snapshot the threads of `pid`; ProcessLookupError when it does not exist."""
    threads = {
        thread_id: parse_task_stat(thread_id, stat)
        for thread_id, stat in _read_every_thread(pid, "stat", 4096).items()
    }
    return ThreadCpuSnapshot(pid, threads)


def read_thread_run_time(pid: int) -> dict[int, int]:
    """The CPU time of every thread of `pid` so far in ns, by thread id (schedstat);
    ProcessLookupError when the process does not exist."""
    return {
        thread_id: int(schedstat.split(b" ", 1)[0])
        for thread_id, schedstat in _read_every_thread(pid, "schedstat", 64).items()
    }


def read_thread_sleeps(pid: int) -> dict[int, int]:
    """How often every thread of `pid` has gone to sleep so far, by thread id;
    ProcessLookupError when the process does not exist."""
    # status is about 1.5 kB; its CPU masks make it longer where the kernel allows
    # thousands of CPUs.
    return {
        thread_id: parse_voluntary_switches(status)
        for thread_id, status in _read_every_thread(pid, "status", 65536).items()
    }


def parse_voluntary_switches(status: bytes) -> int:
    """The voluntary context switches in the text of a /proc/.../status file."""
    found = re.search(rb"^voluntary_ctxt_switches:\s*(\d+)$", status, re.MULTILINE)
    if found is None:
        raise ValueError("no voluntary_ctxt_switches line in the status text")
    return int(found.group(1))


def threads_that_ran(before: dict[int, int], after: dict[int, int]) -> int:
    """Threads that used CPU between two run-time readings (new ones if they ran)."""
    return sum(1 for thread_id, ns in after.items() if ns > before.get(thread_id, 0))


def main_thread_split(
    start: dict[int, int], end: dict[int, int], pid: int, seconds: float
) -> dict:
    """Where process `pid`'s CPU went between two run-time readings `seconds` apart,
    as percents of one core: its main thread (the event loop) and all its other
    threads (the intra-op OpenMP team and helper threads). A thread whose counter
    went backwards between the readings (an id reused) is left out."""
    if not end or seconds <= 0:
        return {"main_thread_cpu_percent": None, "other_threads_cpu_percent": None}
    used = {
        thread: run_time - start.get(thread, 0)
        for thread, run_time in end.items()
        if run_time >= start.get(thread, 0)
    }
    main = used.get(pid, 0)
    others = sum(used.values()) - main
    return {
        "main_thread_cpu_percent": 100 * main / 1e9 / seconds,
        "other_threads_cpu_percent": 100 * others / 1e9 / seconds,
    }


def _read_every_thread(pid: int, file_name: str, size: int) -> dict[int, bytes]:
    """The first `size` bytes of /proc/<pid>/task/<tid>/<file_name> of every thread
    alive while they are read, by thread id; ProcessLookupError when `pid` is gone."""
    # Plain os calls on string paths: an OpenMP team can be hundreds of threads.
    task_directory = f"/proc/{pid}/task/"
    try:
        thread_ids = os.listdir(task_directory)
    except FileNotFoundError:
        raise ProcessLookupError(
            f"no process {pid} ({task_directory} is gone)"
        ) from None
    texts = {}
    for thread_id in thread_ids:
        path = f"{task_directory}{thread_id}/{file_name}"
        try:
            descriptor = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended while the directory was read
        try:
            text = os.read(descriptor, size)
        except ProcessLookupError:
            text = b""
        finally:
            os.close(descriptor)
        if text:  # empty (or ESRCH) when the thread ended after the open
            texts[int(thread_id)] = text
    return texts
