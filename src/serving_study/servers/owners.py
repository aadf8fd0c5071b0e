"""Who owns what a run leaves on the host: a process, named so that it is never
mistaken for another.

An owner is its pid, the moment that process started (a reused pid has another)
and its pid namespace (a pipeline in a container with the docker socket sees the
host's pipelines under other pids, and they see it so). A run's cgroups and
containers carry it in their names and labels; once it is gone, they are leftovers.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil

OWNER_MARK = re.compile(r"owner(\d+(?:\.\d+\.\d+)?)")


def owned_name(name: str, owner: str | None = None) -> str:
    """``name`` marked with its owner (this process by default)."""
    return f"{name}-owner{owner or owner_token()}"


def owner_of(name: str) -> str | None:
    """The owner in a name made by ``owned_name`` (suffixes may follow)."""
    for part in reversed(name.split("-")):
        match = OWNER_MARK.fullmatch(part)
        if match:
            return match.group(1)
    return None


def owner_token(pid: int | None = None) -> str:
    """``<pid>.<start ticks>.<pid namespace>`` of ``pid`` (this process by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}.{_start_ticks(pid)}.{_pid_namespace()}"


def owner_alive(owner: str) -> bool:
    """Whether the owner may still be running. One of another pid namespace, or a
    mark we did not make, is not ours to judge, so it counts as alive; an older
    run's bare pid is judged alone."""
    match = OWNER_MARK.fullmatch(f"owner{owner}")
    if match is None:
        return True  # not a mark we made: not ours to remove
    pid, _, rest = owner.partition(".")
    if not rest:
        return alive(int(pid))
    start, namespace = rest.split(".")
    if int(namespace) != _pid_namespace():
        return True
    return alive(int(pid)) and str(_start_ticks(int(pid))) == start


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie is gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start_ticks(pid: int) -> int:
    """When ``pid`` started, in clock ticks since boot (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rpartition(")")[2].split()[19])


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino
