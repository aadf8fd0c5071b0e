"""Files in /dev/shm: which a live process still holds, and what a server's stop
leaves there by design.

SGLang's shutdown kills its children outright, Python's resource tracker among
them, so two kinds of file outlive a server that stopped as asked: SGLang's
load-report files ``sglang_loads_*.shm``, and the named semaphores ``sem.mp-*``
that only the tracker would have unlinked. A server's teardown removes those that
appeared while it ran and that no live process holds (another program on the host
may have made one meanwhile, and still use it). SGLang's own segments name the
pid that made them, as its pid namespace sees it (``segment_creator``,
``namespace_pid``), so a container's can be told from others in a shared /dev/shm.
"""

from __future__ import annotations

import os
from pathlib import Path

SHARED_MEMORY = Path("/dev/shm")
SHUTDOWN_LEFTOVERS = ("sglang_loads_*.shm", "sem.mp-*")
# SGLang 0.5.23 names segments sgl_shm_<kind>_<creator pid>_<8 hex>.
SGLANG_SEGMENT_PREFIX = "sgl_shm_"


def shutdown_leftovers(shared_memory: Path = SHARED_MEMORY) -> set[Path]:
    """The files of the kinds a server's stop leaves, as they are now."""
    return {
        path for pattern in SHUTDOWN_LEFTOVERS for path in shared_memory.glob(pattern)
    }


def remove_unheld(paths: set[Path], shared_memory: Path = SHARED_MEMORY) -> list[str]:
    """Unlink those of ``paths`` that this user owns and no live process has open
    or mapped; return their names. (A process this user cannot read is another
    user's, and cannot open these: both kinds are made readable by their owner
    alone.)"""
    if not paths:
        return []
    held, _ = files_held_open(shared_memory)
    removed = []
    for path in sorted(paths):
        try:
            status = path.stat()
            if status.st_uid != os.geteuid():
                continue
            if file_key(status.st_dev, status.st_ino) in held:
                continue
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path.name)
    return removed


def files_held_open(directory: Path) -> tuple[set[tuple[int, int, int]], bool]:
    """Files in ``directory`` that a live process has open or mapped, as (major,
    minor, inode), and whether every process that matters could be read.

    Not root, another user's processes cannot be read, so the answer is not
    complete. Root can read every process of its own domain; one it cannot
    (a sandbox's init, say) is not one of this workflow's and is passed over.
    """
    prefix = str(directory).rstrip("/") + "/"
    held: set[tuple[int, int, int]] = set()
    complete = True
    for pid in (entry for entry in os.listdir("/proc") if entry.isdigit()):
        try:
            held |= _mapped_files(pid, prefix) | _open_files(pid, prefix)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile
        except PermissionError:
            complete = complete and os.geteuid() == 0
    return held, complete


def _mapped_files(pid: str, prefix: str) -> set[tuple[int, int, int]]:
    found = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            # address perms offset major:minor inode path
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(prefix):
                major, minor = (int(part, 16) for part in fields[3].split(":"))
                found.add((major, minor, int(fields[4])))
    return found


def _open_files(pid: str, prefix: str) -> set[tuple[int, int, int]]:
    found = set()
    descriptors = f"/proc/{pid}/fd"
    for descriptor in os.listdir(descriptors):
        link = f"{descriptors}/{descriptor}"
        try:
            if os.readlink(link).startswith(prefix):
                status = os.stat(link)
                found.add(file_key(status.st_dev, status.st_ino))
        except FileNotFoundError:
            continue
    return found


def file_key(device: int, inode: int) -> tuple[int, int, int]:
    return os.major(device), os.minor(device), inode


def namespace_pid(pid: int) -> int | None:
    """The pid a host process has inside its own pid namespace (NSpid's last field)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def segment_creator(name: str) -> int | None:
    """The creator pid an SGLang segment's name holds (a pid of its namespace)."""
    parts = name.split("_")
    if len(parts) >= 5 and parts[-2].isdigit():
        return int(parts[-2])
    return None
