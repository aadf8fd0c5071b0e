"""CPU-quota control groups for one server run, and their counters.

A server arm runs inside its own control group so that the kernel enforces the arm's
CPU quota and counts the group's CPU use and throttling apart from everything else on
the host (the load client and the samplers stay outside). Both cgroup layouts are
handled:

* cgroup v2: one directory with ``cpu.max`` and ``cpu.stat`` (``usage_usec``,
  ``nr_periods``, ``nr_throttled``, ``throttled_usec``).
* cgroup v1: the ``cpu`` hierarchy holds ``cpu.cfs_quota_us``, ``cpu.cfs_period_us``
  and ``cpu.stat`` (``throttled_time`` in ns); CPU use comes from ``cpuacct.usage``
  (ns) in the ``cpuacct`` hierarchy. The two may be one mount (``cpu,cpuacct``) or two,
  in which case the group is created in both.

Groups are created under a parent named ``serving-study`` below the calling process's
own cgroup. ``group_of_pid`` reads the group of a process someone else created (a
container), without owning its removal.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PARENT_GROUP_NAME = "serving-study"
NO_QUOTA_HINT = "Set `cpu_quota: none` in the config to run without a CPU quota."


class QuotaUnavailable(RuntimeError):
    """No CPU control group can be created or written on this machine."""


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


# --- Finding the hierarchies -----------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    """A mounted cgroup hierarchy as this process sees it."""

    version: int
    controllers: frozenset[str]
    mount_point: Path
    root_in_hierarchy: str  # which cgroup of the hierarchy the mount point shows


def _read_mounts(mountinfo: str) -> list[_Mount]:
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
            mounts.append(_Mount(1, controllers, mount_point, root))
        elif filesystem == "cgroup2":
            mounts.append(_Mount(2, _v2_controllers(mount_point), mount_point, root))
    return mounts


def _unescape(mountinfo_field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n")):
        mountinfo_field = mountinfo_field.replace(escaped, plain)
    return mountinfo_field.replace("\\134", "\\")


def _v2_controllers(directory: Path) -> frozenset[str]:
    try:
        return frozenset((directory / "cgroup.controllers").read_text().split())
    except OSError:
        return frozenset()


def _read_membership(proc_cgroup: str) -> dict[str, str]:
    """Map each v1 controller (and "" for v2) to its path, from /proc/*/cgroup."""
    membership = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            membership[""] = path
        for controller in controllers.split(","):
            if controller:
                membership[controller] = path
    return membership


def _directory_of(mount: _Mount, cgroup_path: str) -> Path:
    """The directory of a cgroup path (as in /proc/*/cgroup) under a mount."""
    root = mount.root_in_hierarchy.rstrip("/")
    if root and (cgroup_path == root or cgroup_path.startswith(root + "/")):
        cgroup_path = cgroup_path[len(root) :]
    return mount.mount_point / cgroup_path.lstrip("/")


@dataclass(frozen=True)
class _Layout:
    """Where a process's CPU group lives: one directory (v2) or two (v1)."""

    version: int
    cpu_directory: Path  # quota and throttling
    usage_directory: Path  # CPU use (the same directory unless v1 splits cpuacct)


def _layout_for(pid: int | str) -> _Layout:
    """Directories of the CPU group that process `pid` ("self" allowed) belongs to."""
    try:
        mounts = _read_mounts(Path("/proc/self/mountinfo").read_text())
        membership = _read_membership(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError as error:
        raise QuotaUnavailable(
            f"Cannot read the cgroup membership of process {pid}: {error}. "
            + NO_QUOTA_HINT
        ) from error

    def v1_mount(controller: str) -> _Mount | None:
        for mount in mounts:
            if mount.version == 1 and controller in mount.controllers:
                return mount
        return None

    cpu_mount, cpuacct_mount = v1_mount("cpu"), v1_mount("cpuacct")
    if cpu_mount and cpuacct_mount and "cpu" in membership:
        return _Layout(
            version=1,
            cpu_directory=_directory_of(cpu_mount, membership["cpu"]),
            usage_directory=_directory_of(cpuacct_mount, membership["cpuacct"]),
        )
    for mount in mounts:
        if mount.version == 2 and "cpu" in mount.controllers and "" in membership:
            directory = _directory_of(mount, membership[""])
            return _Layout(
                version=2, cpu_directory=directory, usage_directory=directory
            )
    raise QuotaUnavailable(
        "No cgroup hierarchy with the cpu controller is mounted "
        "(looked for cgroup v1 `cpu` and `cpuacct`, and cgroup v2 with `cpu` in "
        "cgroup.controllers). " + NO_QUOTA_HINT
    )


# --- Reading a group ---------------------------------------------------------------


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


def _read_pids(procs_file: Path) -> set[int]:
    try:
        return {int(line) for line in procs_file.read_text().split()}
    except FileNotFoundError:
        return set()


class CpuGroup:
    """A CPU control group that can be read: quota, counters and member processes."""

    def __init__(self, layout: _Layout) -> None:
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
            members |= _read_pids(procs_file)
        return sorted(members)


def group_of_pid(pid: int) -> CpuGroup:
    """The CPU group an existing process belongs to (a container's, say), read-only."""
    return CpuGroup(_layout_for(pid))


# --- Creating and removing a group ---------------------------------------------------


class CpuQuotaGroup(CpuGroup):
    """A CPU control group created for one server run, removed when the run ends."""

    @classmethod
    def create(
        cls, name: str, quota_cores: float | None, period_us: int = 100_000
    ) -> CpuQuotaGroup:
        """Create group `name` with `quota_cores` cores per period (None: no quota)."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(
                f"Cgroup name {name!r} must be one non-empty path element."
            )
        if quota_cores is not None and quota_cores <= 0:
            raise ValueError(
                f"quota_cores must be positive or None, got {quota_cores}."
            )
        if not 1_000 <= period_us <= 1_000_000:
            raise ValueError(f"period_us must be 1000..1000000, got {period_us}.")
        quota_us = None if quota_cores is None else round(quota_cores * period_us)
        if quota_us is not None and quota_us < 1_000:
            raise ValueError(
                f"A quota of {quota_cores} cores is {quota_us} us per period; the "
                "kernel needs at least 1000 us. Use a longer period or more cores."
            )

        own = _layout_for("self")
        _check_room_for_groups(own)
        try:
            if own.version == 2:
                layout = _create_v2(own.cpu_directory, name)
            else:
                layout = _create_v1(own, name)
            group = cls(layout)
            group._write_quota(quota_us, period_us)
        except (OSError, QuotaUnavailable) as error:
            _discard_partial_group(own, name)
            if isinstance(error, QuotaUnavailable):
                raise
            raise QuotaUnavailable(
                f"Cannot create or write CPU cgroup {name!r} below "
                f"{own.cpu_directory}: {error}. Creating cgroups needs root and a "
                f"writable cgroup filesystem. {NO_QUOTA_HINT}"
            ) from error
        return group

    def set_quota(self, quota_cores: float | None, period_us: int = 100_000) -> None:
        """Change the quota of a live group (as `docker update --cpus` does)."""
        if quota_cores is not None and round(quota_cores * period_us) < 1_000:
            raise ValueError(f"A quota of {quota_cores} cores is below 1000 us.")
        quota_us = None if quota_cores is None else round(quota_cores * period_us)
        self._write_quota(quota_us, period_us)

    def _write_quota(self, quota_us: int | None, period_us: int) -> None:
        if self.version == 2:
            quota_text = "max" if quota_us is None else str(quota_us)
            _write(self.cpu_directory / "cpu.max", f"{quota_text} {period_us}")
        else:
            _write(self.cpu_directory / "cpu.cfs_period_us", str(period_us))
            quota_text = "-1" if quota_us is None else str(quota_us)
            _write(self.cpu_directory / "cpu.cfs_quota_us", quota_text)

    def adopt(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into this group."""
        for procs_file in self.procs_files():
            _write(procs_file, str(pid))

    def kill_all(self, timeout: float = 10.0) -> None:
        """SIGKILL every process left in the group and wait until it is empty."""
        deadline = time.monotonic() + timeout
        while members := self.pids():
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Processes {members} are still in cgroup {self.cpu_directory} "
                    f"{timeout} s after SIGKILL (stuck in the kernel, e.g. on I/O)."
                )
            time.sleep(0.02)

    def remove(self, timeout: float = 10.0) -> None:
        """Kill what is left and delete the group in every hierarchy; safe to repeat."""
        if not any(directory.exists() for directory in self.directories()):
            return
        self.kill_all(timeout)
        deadline = time.monotonic() + timeout
        for directory in self.directories():
            _remove_directory(directory, deadline)
            _remove_if_empty(directory.parent)

    def __enter__(self) -> CpuQuotaGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


# --- Groups that dead runs left ------------------------------------------------------


def project_group_directories() -> list[Path]:
    """Every group below a ``serving-study`` parent where groups are made: below
    this process's own cgroup, and below each CPU hierarchy's root (cgroup v2
    falls back to it; another run may have been in another cgroup)."""
    try:
        own = _layout_for("self")
        mounts = _read_mounts(Path("/proc/self/mountinfo").read_text())
    except (QuotaUnavailable, OSError):
        return []
    bases = {own.cpu_directory, own.usage_directory}
    for mount in mounts:
        if mount.version == 2 or mount.controllers & {"cpu", "cpuacct"}:
            bases.add(mount.mount_point)
    directories = []
    for base in sorted(bases):
        try:
            children = sorted((base / PARENT_GROUP_NAME).iterdir())
        except OSError:
            continue
        directories += [child for child in children if child.is_dir()]
    return directories


def remove_group_directory(directory: Path, timeout: float = 10.0) -> list[int]:
    """SIGKILL what one group directory holds and remove it; return the pids
    killed. For a group this process did not create (a dead run's)."""
    pids = sorted(_read_pids(directory / "cgroup.procs"))
    version = 2 if (directory / "cgroup.controllers").exists() else 1
    CpuQuotaGroup(_Layout(version, directory, directory)).remove(timeout)
    return pids


def wrap_command(group: CpuGroup, argv: list[str]) -> list[str]:
    """`argv` prefixed so that its process joins `group` before it starts (no race)."""
    # Run the helper by file path with -I -S: it needs only the standard library,
    # so it works whether or not this package is installed, and starts fast.
    helper = Path(__file__).with_name("cgroup_exec.py")
    joins = [part for path in group.procs_files() for part in ("--join", str(path))]
    return [sys.executable, "-I", "-S", str(helper), *joins, "--", *argv]


def _check_room_for_groups(own: _Layout) -> None:
    """Explain the two ways a host can refuse before anything is created."""
    for directory in {own.cpu_directory, own.usage_directory}:
        if not directory.is_dir():
            raise QuotaUnavailable(
                f"This process's own cgroup {directory} is not visible in the "
                "mounted cgroup filesystem (a container with a partial view?), so no "
                f"group can be created below it. {NO_QUOTA_HINT}"
            )
    if own.version == 2 and not _v2_bases(own.cpu_directory):
        raise QuotaUnavailable(
            f"The cpu controller is not delegated to this process's cgroup "
            f"{own.cpu_directory} (its cgroup.controllers lacks `cpu`), and the "
            "hierarchy's root is not writable, so a CPU quota cannot be set. Run "
            "as root on the host, or under `systemd-run --scope -p Delegate=yes`. "
            f"{NO_QUOTA_HINT}"
        )


def _write(path: Path, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)


def _make_group_directory(parent: Path, name: str) -> Path:
    """Create `parent/name`; an empty leftover of a crashed run is replaced."""
    parent.mkdir(exist_ok=True)
    directory = parent / name
    if directory.exists():
        leftovers = _read_pids(directory / "cgroup.procs")
        if leftovers:
            raise QuotaUnavailable(
                f"Cgroup {directory} already exists and holds processes "
                f"{sorted(leftovers)} (another run with the same name, or a leftover)."
                " Stop them or pick another run name."
            )
        directory.rmdir()
    directory.mkdir()
    return directory


def _create_v1(own: _Layout, name: str) -> _Layout:
    cpu_directory = _make_group_directory(own.cpu_directory / PARENT_GROUP_NAME, name)
    if own.usage_directory == own.cpu_directory:
        return _Layout(1, cpu_directory, cpu_directory)
    usage_directory = _make_group_directory(
        own.usage_directory / PARENT_GROUP_NAME, name
    )
    return _Layout(1, cpu_directory, usage_directory)


def _create_v2(own_directory: Path, name: str) -> _Layout:
    """Create the group below our own cgroup, or below the root if that is not allowed.

    cgroup v2 lets a cgroup hand controllers to its children only while it holds no
    processes itself (the root excepted), so enabling `cpu` below our own cgroup fails
    with EBUSY when we are not alone in a leaf, and with ENOENT when `cpu` was never
    delegated to our cgroup; then the hierarchy root is used.
    """
    last_error: OSError | None = None
    for base in _v2_bases(own_directory):
        try:
            _enable_cpu_controller(base)
            parent = base / PARENT_GROUP_NAME
            parent.mkdir(exist_ok=True)
            _enable_cpu_controller(parent)
            directory = _make_group_directory(parent, name)
            return _Layout(2, directory, directory)
        except OSError as error:
            if error.errno not in (
                errno.EBUSY,
                errno.ENOENT,
                errno.ENOTSUP,
                errno.EOPNOTSUPP,
            ):
                raise
            last_error = error
    assert last_error is not None
    raise last_error


def _v2_bases(own_directory: Path) -> list[Path]:
    """Where a group may be made: below our own cgroup when `cpu` is delegated to
    it, else (as root, which may write there) below the hierarchy's root."""
    bases = []
    if "cpu" in _v2_controllers(own_directory):
        bases.append(own_directory)
    root = _v2_root_of(own_directory)
    if root not in bases and os.access(root / "cgroup.subtree_control", os.W_OK):
        bases.append(root)
    return bases


def _v2_root_of(directory: Path) -> Path:
    while (
        directory.parent != directory and (directory.parent / "cgroup.procs").exists()
    ):
        directory = directory.parent
    return directory


def _enable_cpu_controller(directory: Path) -> None:
    enabled = (directory / "cgroup.subtree_control").read_text().split()
    if "cpu" not in enabled:
        _write(directory / "cgroup.subtree_control", "+cpu")


def _discard_partial_group(own: _Layout, name: str) -> None:
    """Remove what a failed create() made; rmdir never removes a group in use."""
    bases = {own.cpu_directory, own.usage_directory}
    if own.version == 2:
        bases.add(_v2_root_of(own.cpu_directory))
    for base in bases:
        try:
            (base / PARENT_GROUP_NAME / name).rmdir()
        except OSError:
            pass
        try:
            _remove_if_empty(base / PARENT_GROUP_NAME)
        except OSError:
            pass


def _remove_directory(directory: Path, deadline: float) -> None:
    """rmdir a cgroup, retrying while the kernel still counts dying tasks in it."""
    while True:
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _remove_if_empty(parent: Path) -> None:
    """Remove the shared `serving-study` parent once no other run uses it."""
    if parent.name != PARENT_GROUP_NAME:
        return
    try:
        parent.rmdir()
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EBUSY, errno.ENOENT):
            raise
