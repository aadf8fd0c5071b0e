"""What a runner killed outright left on the host, found and removed.

A runner that dies by SIGKILL, the OOM killer, ``timeout --kill-after`` or a
SLURM job kill runs no teardown. Its server dies with it (``parent_death``,
``container_watchdog``), but its cgroups stay, a container may stay, and so do
shared-memory segments: SGLang's ``sgl_shm_<kind>_<pid>_<hex>`` (the embedded
engine's too), SGLang's load-report files ``sglang_loads_*.shm`` and Python's
named semaphores ``sem.mp-*``, which only the dead tree's resource tracker would
have unlinked. The preflight and every arm call ``reap_leftovers`` first, while
holding the host's measurement lock.

What belongs to whom, and what is never touched:

* a container carries its runner's pid as the label ``serving-study.owner``,
  and a cgroup has it in its name (``owned_name``); both are removed only when
  that process is gone;
* a segment named with its creator's pid goes only when that process is gone
  and no live process has it open or mapped; a segment without a pid in its
  name only when no live process has it open or mapped (all processes must be
  readable for that, so only root removes those);
* Python's unnamed ``psm_*`` segments (SGLang 0.5.9's) are left alone: any
  program makes them, and one in flight between two live processes is held by
  neither.

A dead tree frees its GPU memory with its processes; there is nothing to do
for the GPU.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from serving_study.servers.cgroups import (
    project_group_directories,
    remove_group_directory,
)
from serving_study.servers.container_commands import OWNER_LABEL
from serving_study.servers.shared_memory import (
    SHARED_MEMORY,
    file_key,
    files_held_open,
    segment_creator,
)

log = logging.getLogger(__name__)

PID_STAMPED_PREFIXES = ("sgl_shm_",)
UNSTAMPED_PREFIXES = ("sglang_loads_", "sem.mp-")
OWNER_MARK = re.compile(r"owner(\d+)")
RUNTIME_COMMAND_TIMEOUT_S = 120


@dataclass
class Reaped:
    """What one sweep removed, and what it could not remove (with why)."""

    containers: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def found_any(self) -> bool:
        return bool(self.containers or self.cgroups or self.segments)

    def summary(self) -> str:
        return (
            f"{len(self.containers)} containers, {len(self.cgroups)} cgroups "
            f"({len(self.processes)} processes in them), "
            f"{len(self.segments)} shared-memory segments"
        )


def owned_name(name: str, owner_pid: int | None = None) -> str:
    """``name`` marked with the pid of the process that owns what it names
    (this process by default): once that process is gone, it is a leftover."""
    return f"{name}-owner{os.getpid() if owner_pid is None else owner_pid}"


def owner_of(name: str) -> int | None:
    """The owner's pid in a name made by ``owned_name`` (suffixes may follow)."""
    for part in reversed(name.split("-")):
        match = OWNER_MARK.fullmatch(part)
        if match:
            return int(match.group(1))
    return None


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie is gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def reap_leftovers(
    container_runtimes: tuple[str, ...] = (), shared_memory: Path = SHARED_MEMORY
) -> Reaped:
    """Remove what dead runs left: containers of ``container_runtimes``, cgroups,
    then (their creators now gone) shared-memory segments."""
    reaped = Reaped()
    for runtime in container_runtimes:
        reap_containers(runtime, reaped)
    reap_groups(reaped)
    reap_segments(shared_memory, reaped)
    if reaped.found_any():
        log.warning("removed what dead runs left: %s", reaped.summary())
    for problem in reaped.problems:
        log.warning("could not remove a leftover: %s", problem)
    return reaped


def reap_containers(runtime: str, reaped: Reaped) -> None:
    """Remove this workflow's containers whose runner is gone (stopped or not)."""
    try:
        for identifier, owner, name in _owned_containers(runtime):
            if alive(owner):
                continue
            removed = _runtime(runtime, "rm", "--force", "--volumes", "--", identifier)
            if removed.returncode == 0:
                reaped.containers.append(name)
            elif "no such container" not in removed.stderr.lower():
                reaped.problems.append(f"{runtime} rm {name}: {removed.stderr.strip()}")
    except (OSError, subprocess.SubprocessError, RuntimeError) as error:
        reaped.problems.append(f"{runtime}: {error}")


def _owned_containers(runtime: str) -> list[tuple[str, int, str]]:
    """(id, owner pid, name) of every container with an owner label."""
    listed = _runtime(
        runtime, "ps", "--all", "--quiet", "--filter", f"label={OWNER_LABEL}"
    )
    if listed.returncode != 0:
        raise RuntimeError(f"{runtime} ps failed: {listed.stderr.strip()}")
    identifiers = listed.stdout.split()
    if not identifiers:
        return []
    template = f'{{{{.Id}}}} {{{{index .Config.Labels "{OWNER_LABEL}"}}}} {{{{.Name}}}}'
    inspected = _runtime(runtime, "inspect", "--format", template, "--", *identifiers)
    owned = []
    for line in inspected.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit():
            owned.append((parts[0], int(parts[1]), parts[2].lstrip("/")))
    return owned


def reap_groups(reaped: Reaped) -> None:
    """Kill what is left in the cgroups of dead owners and remove the groups."""
    for directory in project_group_directories():
        owner = owner_of(directory.name)
        if owner is None or alive(owner):
            continue
        try:
            reaped.processes += remove_group_directory(directory)
            reaped.cgroups.append(str(directory))
        except (OSError, TimeoutError) as error:
            reaped.problems.append(f"cgroup {directory}: {error}")


def reap_segments(shared_memory: Path, reaped: Reaped) -> None:
    """Unlink segments no live process owns (see the module's docstring)."""
    candidates = []
    for name in sorted(os.listdir(shared_memory)):
        if name.startswith(PID_STAMPED_PREFIXES):
            creator = segment_creator(name)
            if creator is not None and not alive(creator):
                candidates.append(name)
        elif name.startswith(UNSTAMPED_PREFIXES):
            candidates.append(name)
    if not candidates:
        return
    held, complete = files_held_open(shared_memory)
    for name in candidates:
        path = shared_memory / name
        try:
            status = path.stat()
        except FileNotFoundError:
            continue
        if file_key(status.st_dev, status.st_ino) in held:
            continue
        if not complete and name.startswith(UNSTAMPED_PREFIXES):
            continue  # some process could not be read: it might hold this one
        try:
            path.unlink()
            reaped.segments.append(name)
        except FileNotFoundError:
            continue
        except OSError as error:
            reaped.problems.append(f"{path}: {error}")


def _runtime(runtime: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [runtime, *arguments],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUNTIME_COMMAND_TIMEOUT_S,
    )
