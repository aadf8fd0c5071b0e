"""Where a process's CPU control group lives, in either cgroup layout.

* cgroup v2: one directory with ``cpu.max`` and ``cpu.stat`` (``usage_usec``,
  ``nr_periods``, ``nr_throttled``, ``throttled_usec``).
* cgroup v1: the ``cpu`` hierarchy holds ``cpu.cfs_quota_us``, ``cpu.cfs_period_us``
  and ``cpu.stat`` (``throttled_time`` in ns); CPU use comes from ``cpuacct.usage``
  (ns) in the ``cpuacct`` hierarchy. The two may be one mount (``cpu,cpuacct``) or two,
  in which case a group has a directory in both.

The mounts come from ``/proc/self/mountinfo`` and a process's membership from
``/proc/<pid>/cgroup``; ``layout_for`` joins the two into the group's directories.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

NO_QUOTA_HINT = "Set `cpu_quota: none` in the config to run without a CPU quota."


class QuotaUnavailable(RuntimeError):
    """No CPU control group can be created or written on this machine."""


@dataclass(frozen=True)
class Mount:
    """A mounted cgroup hierarchy as this process sees it."""

    version: int
    controllers: frozenset[str]
    mount_point: Path
    root_in_hierarchy: str  # which cgroup of the hierarchy the mount point shows


@dataclass(frozen=True)
class Layout:
    """Where a process's CPU group lives: one directory (v2) or two (v1)."""

    version: int
    cpu_directory: Path  # quota and throttling
    usage_directory: Path  # CPU use (the same directory unless v1 splits cpuacct)


def read_mounts(mountinfo: str) -> list[Mount]:
    """cgroup mounts from the text of /proc/self/mountinfo."""
    mounts = []
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        filesystem, super_options = tail[0], tail[2]
        root, mount_point = _unescape(fields[3]), Path(_unescape(fields[4]))
        if filesystem == "cgroup":
            controllers = frozenset(super_options.split(",")) - {"rw", "ro"}
            mounts.append(Mount(1, controllers, mount_point, root))
        elif filesystem == "cgroup2":
            mounts.append(Mount(2, v2_controllers(mount_point), mount_point, root))
    return mounts


def _unescape(mountinfo_field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n")):
        mountinfo_field = mountinfo_field.replace(escaped, plain)
    return mountinfo_field.replace("\\134", "\\")


def v2_controllers(directory: Path) -> frozenset[str]:
    """The controllers a cgroup v2 directory offers its children."""
    try:
        return frozenset((directory / "cgroup.controllers").read_text().split())
    except OSError:
        return frozenset()


def read_membership(proc_cgroup: str) -> dict[str, str]:
    """Map each v1 controller (and "" for v2) to its path, from /proc/*/cgroup."""
    membership = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(","):  # v2's empty list gives ""
            membership[controller] = path
    return membership


def directory_of(mount: Mount, cgroup_path: str) -> Path:
    """The directory of a cgroup path (as in /proc/*/cgroup) under a mount."""
    root = mount.root_in_hierarchy.rstrip("/")
    if root and (cgroup_path == root or cgroup_path.startswith(root + "/")):
        cgroup_path = cgroup_path[len(root) :]
    return mount.mount_point / cgroup_path.lstrip("/")


def layout_for(pid: int | str) -> Layout:
    """Directories of the CPU group that process `pid` ("self" allowed) belongs to."""
    try:
        mounts = read_mounts(Path("/proc/self/mountinfo").read_text())
        membership = read_membership(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError as error:
        raise QuotaUnavailable(
            f"Cannot read the cgroup membership of process {pid}: {error}. "
            + NO_QUOTA_HINT
        ) from error

    def v1_mount(controller: str) -> Mount | None:
        found = (m for m in mounts if m.version == 1 and controller in m.controllers)
        return next(found, None)

    cpu_mount, cpuacct_mount = v1_mount("cpu"), v1_mount("cpuacct")
    if cpu_mount and cpuacct_mount and "cpu" in membership:
        return Layout(
            version=1,
            cpu_directory=directory_of(cpu_mount, membership["cpu"]),
            usage_directory=directory_of(cpuacct_mount, membership["cpuacct"]),
        )
    for mount in mounts:
        if mount.version == 2 and "cpu" in mount.controllers and "" in membership:
            directory = directory_of(mount, membership[""])
            return Layout(version=2, cpu_directory=directory, usage_directory=directory)
    raise QuotaUnavailable(
        "No cgroup hierarchy with the cpu controller is mounted "
        "(looked for cgroup v1 `cpu` and `cpuacct`, and cgroup v2 with `cpu` in "
        "cgroup.controllers). " + NO_QUOTA_HINT
    )
