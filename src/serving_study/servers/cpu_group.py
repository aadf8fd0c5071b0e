"""Reading a CPU control group: its quota, its counters and its member processes.

A server arm runs inside its own control group so that the kernel enforces the arm's
CPU quota and counts the group's CPU use and throttling apart from everything else on
the host (the load client and the samplers stay outside). ``CpuGroup`` reads such a
group in either cgroup layout (see ``cgroup_hierarchy``); ``group_of_pid`` finds the
group of a process someone else placed (a container), without owning its removal.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from serving_study.servers.cgroup_hierarchy import Layout, layout_for


@dataclass(frozen=True)
class CpuStat:
    """One reading of a group's cumulative CPU counters."""

    usage_seconds: float
    nr_periods: int
    nr_throttled: int
    throttled_seconds: float
    read_at: float  # time.monotonic() when read

    def delta(self, later: CpuStat) -> dict:
        """What happened between this reading and a later one."""
        wall_seconds = later.read_at - self.read_at
        usage_seconds = later.usage_seconds - self.usage_seconds
        nr_periods = later.nr_periods - self.nr_periods
        nr_throttled = later.nr_throttled - self.nr_throttled
        return {
            "wall_seconds": wall_seconds,
            "usage_seconds": usage_seconds,
            "cores_used": usage_seconds / wall_seconds if wall_seconds > 0 else None,
            "nr_periods": nr_periods,
            "nr_throttled": nr_throttled,
            "throttled_share": nr_throttled / nr_periods if nr_periods > 0 else None,
            "throttled_seconds": later.throttled_seconds - self.throttled_seconds,
        }


def _read_small_file(path: Path) -> str:
    """A small kernel file's text, read with plain os calls.

    The monitors read the counters ten times a second; `Path.read_text()` costs
    several times the kernel's own work for a file this small.
    """
    descriptor = os.open(path, os.O_RDONLY)
    try:
        return os.read(descriptor, 65536).decode()
    finally:
        os.close(descriptor)


def _read_key_values(path: Path) -> dict[str, int]:
    values = {}
    for line in _read_small_file(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


def read_pids(procs_file: Path) -> set[int]:
    """The processes a cgroup.procs file lists; none once the group is gone."""
    try:
        return {int(line) for line in procs_file.read_text().split()}
    except FileNotFoundError:
        return set()


class CpuGroup:
    """A CPU control group that can be read: quota, counters and member processes."""

    def __init__(self, layout: Layout) -> None:
        self.version = layout.version
        self.cpu_directory = layout.cpu_directory
        self.usage_directory = layout.usage_directory

    def directories(self) -> list[Path]:
        """The group's directory in each hierarchy (one, or two on split cgroup v1)."""
        if self.cpu_directory == self.usage_directory:
            return [self.cpu_directory]
        return [self.cpu_directory, self.usage_directory]

    def procs_files(self) -> list[Path]:
        """The cgroup.procs files a process must join, one per hierarchy."""
        return [directory / "cgroup.procs" for directory in self.directories()]

    def quota_in_force(self) -> dict:
        """The quota the kernel holds for this group, read back from its files."""
        if self.version == 2:
            quota_text, period_text = (
                (self.cpu_directory / "cpu.max").read_text().split()
            )
            quota_us = None if quota_text == "max" else int(quota_text)
            period_us = int(period_text)
        else:
            raw_quota = int((self.cpu_directory / "cpu.cfs_quota_us").read_text())
            quota_us = None if raw_quota < 0 else raw_quota
            period_us = int((self.cpu_directory / "cpu.cfs_period_us").read_text())
        return {
            "version": self.version,
            "quota_us": quota_us,
            "period_us": period_us,
            "cores": None if quota_us is None else quota_us / period_us,
            "directories": [str(directory) for directory in self.directories()],
        }

    def read_stat(self) -> CpuStat:
        """The group's cumulative CPU use and throttling counters, now."""
        cpu_stat = _read_key_values(self.cpu_directory / "cpu.stat")
        if self.version == 2:
            usage_seconds = cpu_stat["usage_usec"] / 1e6
            throttled_seconds = cpu_stat.get("throttled_usec", 0) / 1e6
        else:
            usage_ns = int(_read_small_file(self.usage_directory / "cpuacct.usage"))
            usage_seconds = usage_ns / 1e9
            throttled_seconds = cpu_stat.get("throttled_time", 0) / 1e9
        return CpuStat(
            usage_seconds=usage_seconds,
            nr_periods=cpu_stat.get("nr_periods", 0),
            nr_throttled=cpu_stat.get("nr_throttled", 0),
            throttled_seconds=throttled_seconds,
            read_at=time.monotonic(),
        )

    def pids(self) -> list[int]:
        """Processes in the group (in any of its hierarchies), sorted."""
        members: set[int] = set()
        for procs_file in self.procs_files():
            members |= read_pids(procs_file)
        return sorted(members)


def group_of_pid(pid: int) -> CpuGroup:
    """The CPU group an existing process belongs to (a container's, say), read-only."""
    return CpuGroup(layout_for(pid))
