"""The host's other CPU load during a measured window.

The lock in ``host_sharing`` keeps other pipelines of this workflow off the
host, but not anything else. Whatever else runs competes with the server for
the CPUs and with the quota's periods, so each window measures it: the CPU time
the whole host spent busy (``/proc/stat``) minus what the run itself used, its
server's control groups and its runner (the client and the monitors). What is
left, in cores averaged over the window, is other load.

Busy is user, nice, system, irq and softirq time (guest time is inside user and
nice). Steal time, CPU the hypervisor gave to other guests, is reported beside
it but not counted: it slows the server without showing in any cgroup.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from serving_study.config.records import HostSharing
from serving_study.servers.cpu_group import CpuStat

CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
PROC_STAT = "/proc/stat"
# Fields of /proc/stat's "cpu" line, in order (man 5 proc).
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


class CountedGroup(Protocol):
    """A control group whose CPU use counts as the run's own."""

    def read_stat(self) -> CpuStat: ...


@dataclass(frozen=True)
class HostCpu:
    """The host's cumulative CPU time, all CPUs together, in seconds."""

    busy_seconds: float
    steal_seconds: float


@dataclass(frozen=True)
class LoadReading:
    """Counters read at one instant: the host's, and the run's own CPU seconds."""

    at: float  # time.monotonic()
    host: HostCpu
    own_seconds: float


def parse_proc_stat(text: str) -> HostCpu:
    """The host's busy and steal time from the text of /proc/stat."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            # Later fields (guest, guest_nice) are already inside user and nice.
            values = [int(value) for value in fields[1 : len(CPU_FIELDS) + 1]]
            ticks = dict(zip(CPU_FIELDS[: len(values)], values, strict=True))
            busy = sum(ticks.get(name, 0) for name in BUSY_FIELDS)
            return HostCpu(
                busy_seconds=busy / CLOCK_TICKS_PER_SECOND,
                steal_seconds=ticks.get("steal", 0) / CLOCK_TICKS_PER_SECOND,
            )
    raise ValueError("no aggregate `cpu` line in /proc/stat")


def read_host_cpu() -> HostCpu:
    descriptor = os.open(PROC_STAT, os.O_RDONLY)
    try:
        return parse_proc_stat(os.read(descriptor, 1 << 16).decode())
    finally:
        os.close(descriptor)


def runner_cpu_seconds() -> float:
    """CPU this process used so far, all threads: the client and the monitors."""
    times = os.times()
    return times.user + times.system


def other_load(start: LoadReading, end: LoadReading) -> dict:
    """Host busy, own and other CPU between two readings, in cores."""
    wall = end.at - start.at
    if wall <= 0:
        raise ValueError("the end reading must come after the start reading")
    busy = end.host.busy_seconds - start.host.busy_seconds
    own = end.own_seconds - start.own_seconds
    steal = end.host.steal_seconds - start.host.steal_seconds
    return {
        "wall_seconds": round(wall, 3),
        "host_busy_cores": round(busy / wall, 3),
        "own_cores": round(own / wall, 3),
        "other_cores": round((busy - own) / wall, 3),
        "steal_cores": round(steal / wall, 3),
    }


class HostLoadMeter:
    """Reads the counters at a window's start and end; ``stop`` gives the load."""

    def __init__(
        self,
        own_groups: Sequence[CountedGroup],
        *,
        read_host: Callable[[], HostCpu] = read_host_cpu,
        read_runner: Callable[[], float] = runner_cpu_seconds,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.own_groups = list(own_groups)
        self._read_host = read_host
        self._read_runner = read_runner
        self._clock = clock
        self._start: LoadReading | None = None

    def read(self) -> LoadReading:
        own = self._read_runner() + sum(
            group.read_stat().usage_seconds for group in self.own_groups
        )
        return LoadReading(at=self._clock(), host=self._read_host(), own_seconds=own)

    def start(self) -> None:
        self._start = self.read()

    def stop(self) -> dict:
        if self._start is None:
            raise RuntimeError("the meter was never started")
        return other_load(self._start, self.read())


def wait_for_quiet_host(
    sharing: HostSharing,
    *,
    read_host: Callable[[], HostCpu] = read_host_cpu,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """Watch windows of ``quiet_for_s`` until one sees other load and steal
    within the run's bounds, or ``quiet_wait_s`` has passed; say which, how long
    it took and what the last window saw."""
    started = clock()
    while True:
        meter = HostLoadMeter([], read_host=read_host, clock=clock)
        meter.start()
        sleep(sharing.quiet_for_s)
        load = meter.stop()
        quiet = (
            load["other_cores"] <= sharing.max_other_load_cores
            and load["steal_cores"] <= sharing.max_steal_cores
        )
        waited = round(clock() - started, 3)
        if quiet or waited >= sharing.quiet_wait_s:
            return {"quiet": quiet, "waited_s": waited, "last_window": load}
