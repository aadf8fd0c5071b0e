"""The cumulative counters the monitors read at one instant, and their rates.

Two per process, the main and the scheduler: CPU seconds and the OS thread count,
from one read of /proc/<pid>/stat. One per control group: its ``cpu.stat`` (cores
used, throttled periods). A window's figures subtract the readings at its start and
end, so they do not depend on how often the monitors sample in between.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from serving_study.measure.server_processes import ServerProcesses
from serving_study.measure.thread_cpu import CLOCK_TICKS_PER_SECOND
from serving_study.servers.cpu_group import CpuGroup, CpuStat


@dataclass
class CounterReading:
    """Counters read at one instant; None for a process that had exited."""

    at: float
    main_cpu: float | None
    scheduler_cpu: float | None
    main_threads: int | None
    group: CpuStat | None


def read_counters(processes: ServerProcesses, group: CpuGroup | None) -> CounterReading:
    """The server's counters now: its main process, scheduler and group."""
    main_cpu, main_threads = cpu_seconds_and_threads(processes.main.pid)
    scheduler_cpu = None
    if processes.scheduler is not None:
        scheduler_cpu, _ = cpu_seconds_and_threads(processes.scheduler.pid)
    group_stat = group.read_stat() if group is not None else None
    return CounterReading(
        time.monotonic(), main_cpu, scheduler_cpu, main_threads, group_stat
    )


def cpu_seconds_and_threads(pid: int) -> tuple[float | None, int | None]:
    """User + system CPU seconds and thread count of a process; None once it exited.

    One read of /proc/<pid>/stat, the counters psutil reads too (a zombie counts as
    exited): at 10 Hz psutil's own per-call work was most of the monitors' CPU.
    """
    try:
        descriptor = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            stat = os.read(descriptor, 4096)
        finally:
            os.close(descriptor)
    except OSError:
        return None, None
    # The fields after the command name, which is in parentheses and may hold spaces:
    # state, then (counting from 0) utime at 11, stime at 12, num_threads at 17.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if not fields or fields[0] == b"Z":
        return None, None
    cpu_seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_SECOND
    return cpu_seconds, int(fields[17])


def percent(before: float | None, after: float | None, seconds: float) -> float | None:
    """CPU seconds spent between two readings, as a percent of one core."""
    if before is None or after is None or seconds <= 0:
        return None
    return 100 * (after - before) / seconds
