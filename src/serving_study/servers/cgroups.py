"""Creating and removing the CPU-quota control group of one server run.

``CpuQuotaGroup.create`` makes a group with the arm's quota under a parent named
``serving-study`` below the calling process's own cgroup (on cgroup v2, below the
hierarchy's root when the ``cpu`` controller cannot be enabled there), and
``wrap_command`` starts a server inside it. ``remove`` kills what is left and
deletes the group (never the shared parent, where another pipeline may be making a
group at that moment); ``project_group_directories`` and ``remove_group_directory``
find and remove the groups that dead runs left behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import time
from pathlib import Path

from serving_study.servers.cgroup_hierarchy import (
    NO_QUOTA_HINT,
    Layout,
    QuotaUnavailable,
    layout_for,
    read_mounts,
    v2_controllers,
)
from serving_study.servers.cpu_group import CpuGroup, read_pids

PARENT_GROUP_NAME = "serving-study"
# Opting in to groups at a cgroup v2 hierarchy's root, outside this process's own
# cgroup (and so outside the limits of a SLURM job or a systemd slice around it).
AT_ROOT_VARIABLE = "SERVING_STUDY_CGROUPS_AT_ROOT"
RUNNER_LEAF = "serving-study-runner"
# What a base answers when no group can be made below it: try the next base.
BASE_REFUSALS = (errno.EBUSY, errno.ENOENT, errno.ENOTSUP, errno.EOPNOTSUPP)


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

        own = layout_for("self")
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
        """SIGKILL every process left in the group and wait until it is empty.

        cgroup v2's ``cgroup.kill`` (Linux 5.14) kills the whole group at once, a
        forking tree included; elsewhere each member is signalled until none is
        left."""
        deadline = time.monotonic() + timeout
        kill_file = self.cpu_directory / "cgroup.kill"
        if self.version == 2 and kill_file.exists() and self.pids():
            _write(kill_file, "1")
        while members := self.pids():
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
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

    def __enter__(self) -> CpuQuotaGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def wrap_command(group: CpuGroup, argv: list[str]) -> list[str]:
    """`argv` prefixed so that its process joins `group` before it starts (no race)."""
    # Run the helper by file path with -I -S: it needs only the standard library,
    # so it works whether or not this package is installed, and starts fast.
    helper = Path(__file__).with_name("cgroup_exec.py")
    joins = [part for path in group.procs_files() for part in ("--join", str(path))]
    return [sys.executable, "-I", "-S", str(helper), *joins, "--", *argv]


def _check_room_for_groups(own: Layout) -> None:
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
            f"{own.cpu_directory} (its cgroup.controllers lacks `cpu`), so a CPU "
            "quota cannot be set inside it. Run under `systemd-run --scope -p "
            "Delegate=yes`, or, as root, set "
            f"{AT_ROOT_VARIABLE}=1 to make the groups at the hierarchy's root, "
            "outside this cgroup and any limit a job scheduler or slice sets on it. "
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
        leftovers = read_pids(directory / "cgroup.procs")
        if leftovers:
            raise QuotaUnavailable(
                f"Cgroup {directory} already exists and holds processes "
                f"{sorted(leftovers)} (another run with the same name, or a leftover)."
                " Stop them or pick another run name."
            )
        directory.rmdir()
    directory.mkdir()
    return directory


def _create_v1(own: Layout, name: str) -> Layout:
    cpu_directory = _make_group_directory(own.cpu_directory / PARENT_GROUP_NAME, name)
    if own.usage_directory == own.cpu_directory:
        return Layout(1, cpu_directory, cpu_directory)
    usage_directory = _make_group_directory(
        own.usage_directory / PARENT_GROUP_NAME, name
    )
    return Layout(1, cpu_directory, usage_directory)


def _create_v2(own_directory: Path, name: str) -> Layout:
    """Create the group below our own cgroup, or below the root when asked.

    cgroup v2 lets a cgroup hand controllers to its children only while it holds no
    processes itself (the root excepted). In our own delegated cgroup its processes
    (ours) first move to a leaf of their own (RUNNER_LEAF), as systemd's delegation
    expects; ENOENT means `cpu` was never delegated to our cgroup.
    """
    own_directory = _outside_runner_leaf(own_directory)
    last_error: OSError | None = None
    for base in _v2_bases(own_directory):
        try:
            if base == own_directory:
                _empty_into_leaf(base)
            _enable_cpu_controller(base)
            parent = base / PARENT_GROUP_NAME
            parent.mkdir(exist_ok=True)
            _enable_cpu_controller(parent)
            directory = _make_group_directory(parent, name)
            return Layout(2, directory, directory)
        except OSError as error:
            if error.errno not in BASE_REFUSALS:
                raise
            last_error = error
    assert last_error is not None
    raise last_error


def _outside_runner_leaf(directory: Path) -> Path:
    """Our own cgroup as groups are made below it: once our processes moved to
    its RUNNER_LEAF, the cgroup that holds that leaf."""
    return directory.parent if directory.name == RUNNER_LEAF else directory


def _empty_into_leaf(directory: Path) -> None:
    """Move every process of ``directory`` into its leaf RUNNER_LEAF, so that it
    may enable controllers for its children."""
    if not read_pids(directory / "cgroup.procs"):
        return
    leaf = directory / RUNNER_LEAF
    leaf.mkdir(exist_ok=True)
    for pid in sorted(read_pids(directory / "cgroup.procs")):
        with contextlib.suppress(ProcessLookupError):
            _write(leaf / "cgroup.procs", str(pid))


def _v2_bases(own_directory: Path) -> list[Path]:
    """Where a group may be made: below our own cgroup when `cpu` is delegated to
    it; below the hierarchy's root only when asked (AT_ROOT_VARIABLE) and
    writable (root)."""
    own_directory = _outside_runner_leaf(own_directory)
    bases = []
    if "cpu" in v2_controllers(own_directory):
        bases.append(own_directory)
    root = _v2_root_of(own_directory)
    at_root = os.environ.get(AT_ROOT_VARIABLE) == "1"
    writable = os.access(root / "cgroup.subtree_control", os.W_OK)
    if root not in bases and at_root and writable:
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


def _discard_partial_group(own: Layout, name: str) -> None:
    """Remove what a failed create() made; rmdir never removes a group in use."""
    bases = {own.cpu_directory, own.usage_directory}
    if own.version == 2:
        bases.add(_v2_root_of(own.cpu_directory))
    for base in bases:
        with contextlib.suppress(OSError):
            (base / PARENT_GROUP_NAME / name).rmdir()


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


# --- Groups that dead runs left ------------------------------------------------------


def project_group_directories() -> list[Path]:
    """Every group below a ``serving-study`` parent where groups are made: below
    this process's own cgroup, and below each CPU hierarchy's root (cgroup v2
    falls back to it; another run may have been in another cgroup)."""
    try:
        own = layout_for("self")
        mounts = read_mounts(Path("/proc/self/mountinfo").read_text())
    except (QuotaUnavailable, OSError):
        return []
    bases = {_outside_runner_leaf(own.cpu_directory), own.usage_directory}
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
    pids = sorted(read_pids(directory / "cgroup.procs"))
    version = 2 if (directory / "cgroup.controllers").exists() else 1
    CpuQuotaGroup(Layout(version, directory, directory)).remove(timeout)
    return pids
