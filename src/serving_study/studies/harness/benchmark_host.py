"""The host the benchmarks ran on, where they ran on it, and how busy it was.

Every benchmark pins its processes to chosen CPUs and, where allowed, raises their
priority, and records how many cores the host kept busy meanwhile and how many of
those other processes used: the host is shared and small.
"""

import contextlib
import os
import platform
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil

from serving_study.servers import host

# Client, zero-work server and copies run at this niceness (when allowed: root), so
# that what other processes do on a shared host enters their figures as little as
# possible. The real arm runs at the default niceness, as the study's arms do.
BENCHMARK_NICENESS = -10


def describe_benchmark_host(client_cpu: int, server_cpu: int) -> dict:
    """What the figures were measured on, and where client and server ran."""
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpu_model": host.cpu_model(),
        "cpu_count": os.cpu_count(),
        "visible_cpus": sorted(os.sched_getaffinity(0)),
        "memory_gib": host.memory_gib(),
        "cgroup_version": host.cgroup_version(),
        "gpu": host.gpu_description(),
        "versions": host.package_versions(),
        "client_cpu": client_cpu,
        "zero_work_server_cpu": server_cpu,
        "load_average_at_start": [round(load, 2) for load in os.getloadavg()],
    }


def client_and_server_cpus() -> tuple[int, int]:
    """Two different visible CPUs for client and server (the same one if only one)."""
    visible = sorted(os.sched_getaffinity(0))
    return visible[0], visible[-1]


@dataclass(frozen=True)
class CpuReading:
    """Host-wide busy CPU seconds and the CPU seconds of our processes, at once."""

    at: float
    host_busy_seconds: float
    own_seconds: float | None  # None: our processes are not all known
    # What a virtual machine's hypervisor gave to other guests (0 on bare metal).
    host_steal_seconds: float = 0.0


def read_cpu(own_processes: list[psutil.Process] | None = None) -> CpuReading:
    times = psutil.cpu_times()
    busy = times.user + times.nice + times.system + times.irq + times.softirq
    steal = getattr(times, "steal", 0.0)
    if own_processes is None:
        return CpuReading(time.monotonic(), busy, None, steal)
    own = 0.0
    for process in own_processes:
        with contextlib.suppress(psutil.Error):
            process_times = process.cpu_times()
            own += process_times.user + process_times.system
    return CpuReading(time.monotonic(), busy, own, steal)


def host_load_between(before: CpuReading, after: CpuReading) -> dict:
    """Cores the whole host kept busy, how many of them other processes used, and
    how many the hypervisor took (steal)."""
    wall = after.at - before.at
    if wall <= 0:
        return {"host_busy_cores": None}
    busy = (after.host_busy_seconds - before.host_busy_seconds) / wall
    steal = (after.host_steal_seconds - before.host_steal_seconds) / wall
    load = {"host_busy_cores": round(busy, 3), "steal_cores": round(steal, 3)}
    if before.own_seconds is not None and after.own_seconds is not None:
        own = (after.own_seconds - before.own_seconds) / wall
        load["other_processes_cores"] = round(max(0.0, busy - own), 3)
    return load


@contextlib.contextmanager
def raised_priority(niceness: int = BENCHMARK_NICENESS) -> Iterator[bool]:
    """Run the calling thread at `niceness`, then restore; yields whether it could."""
    previous = os.getpriority(os.PRIO_PROCESS, 0)  # on Linux: this thread's
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except PermissionError:
        yield False
        return
    try:
        yield True
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, previous)


@contextlib.contextmanager
def pinned_to(cpu: int) -> Iterator[None]:
    """Run the calling thread (and threads it starts) on one CPU, then restore."""
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)
