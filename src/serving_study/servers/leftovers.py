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

* a container carries its runner as the label ``serving-study.owner``, and a
  cgroup has it in its name (``owners.py``); both are removed only when that
  process is gone (not a reused pid, and never one of another pid namespace);
* /dev/shm files go only when a dead runner's server ledger names them (its
  load reports and semaphores, and SGLang's segments its processes made) and no
  live process has them open or mapped: another program's are never touched;
* Python's unnamed ``psm_*`` segments (SGLang 0.5.9's) are left alone.

A dead tree frees its GPU memory with its processes; there is nothing to do
for the GPU.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from serving_study.servers.cgroups import (
    project_group_directories,
    remove_group_directory,
)
from serving_study.servers.container_commands import OWNER_LABEL
from serving_study.servers.owners import owner_alive, owner_of
from serving_study.servers.shared_memory import (
    SHARED_MEMORY,
    file_key,
    files_held_open,
    ledgers,
    segment_creator,
)

log = logging.getLogger(__name__)

PID_STAMPED_PREFIXES = ("sgl_shm_",)
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
            if owner_alive(owner):
                continue
            removed = _runtime(runtime, "rm", "--force", "--volumes", "--", identifier)
            if removed.returncode == 0:
                reaped.containers.append(name)
            elif "no such container" not in removed.stderr.lower():
                reaped.problems.append(f"{runtime} rm {name}: {removed.stderr.strip()}")
    except (OSError, subprocess.SubprocessError, RuntimeError) as error:
        reaped.problems.append(f"{runtime}: {error}")


def _owned_containers(runtime: str) -> list[tuple[str, str, str]]:
    """(id, owner, name) of every container with an owner label."""
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
        if len(parts) == 3 and parts[1].replace(".", "").isdigit():
            owned.append((parts[0], parts[1], parts[2].lstrip("/")))
    return owned


def reap_groups(reaped: Reaped) -> None:
    """Kill what is left in the cgroups of dead owners and remove the groups."""
    for directory in project_group_directories():
        owner = owner_of(directory.name)
        if owner is None or owner_alive(owner):
            continue
        try:
            reaped.processes += remove_group_directory(directory)
            reaped.cgroups.append(str(directory))
        except (OSError, TimeoutError) as error:
            reaped.problems.append(f"cgroup {directory}: {error}")


def reap_segments(shared_memory: Path, reaped: Reaped) -> None:
    """Unlink what dead runners' servers' ledgers name, when nobody holds it. A
    ledger stays while something it names is kept, so a later sweep tries again."""
    dead = [
        (p, ledger)
        for p, ledger in ledgers(shared_memory)
        if not owner_alive(ledger["owner"])
    ]
    if not dead:
        return
    names = os.listdir(shared_memory)
    held, complete = files_held_open(shared_memory)
    for ledger_path, ledger in dead:
        pids = set(ledger["pids"])
        made = {
            name
            for name in names
            if name.startswith(PID_STAMPED_PREFIXES) and segment_creator(name) in pids
        }
        kept = False
        for name in sorted(made | set(ledger["names"])):
            if not complete and name not in made:
                kept = True  # some process could not be read: it might hold this one
                continue
            kept |= not _unlink_unheld(shared_memory / name, held, reaped)
        if not kept:
            ledger_path.unlink(missing_ok=True)


def _unlink_unheld(path: Path, held: set, reaped: Reaped) -> bool:
    """Unlink ``path`` unless a live process holds it; whether it is gone now."""
    try:
        status = path.stat()
        if file_key(status.st_dev, status.st_ino) in held:
            return False
        path.unlink()
        reaped.segments.append(path.name)
    except FileNotFoundError:
        pass
    except OSError as error:
        reaped.problems.append(f"{path}: {error}")
        return False
    return True


def _runtime(runtime: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [runtime, *arguments],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUNTIME_COMMAND_TIMEOUT_S,
    )
