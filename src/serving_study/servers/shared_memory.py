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

While a server runs, its ledger (``record_owned``) names its owner, its processes and
the files of those kinds it made: should its runner be killed, the reaper removes
what the ledger names and nothing that another program on the host made.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

SHARED_MEMORY = Path("/dev/shm")
SHUTDOWN_LEFTOVERS = ("sglang_loads_*.shm", "sem.mp-*")
# SGLang 0.5.23 names segments sgl_shm_<kind>_<creator pid>_<8 hex>.
SGLANG_SEGMENT_PREFIX = "sgl_shm_"
LEDGER_PREFIX = "serving-study-owned-"


def shutdown_leftovers(shared_memory: Path = SHARED_MEMORY) -> set[Path]:
    """The files of the kinds a server's stop leaves, as they are now."""
    return {
        path for pattern in SHUTDOWN_LEFTOVERS for path in shared_memory.glob(pattern)
    }


def record_owned(
    server: str,
    owner: str | None,
    pids: set[int],
    made: set[Path],
    shared_memory: Path = SHARED_MEMORY,
) -> None:
    """Write (or rewrite) the ledger of the running server ``server``."""
    if owner is not None:
        ledger = {
            "owner": owner,
            "pids": sorted(pids),
            "names": sorted(p.name for p in made),
        }
        (shared_memory / f"{LEDGER_PREFIX}{server}.json").write_text(json.dumps(ledger))


def forget_owned(server: str, shared_memory: Path = SHARED_MEMORY) -> None:
    (shared_memory / f"{LEDGER_PREFIX}{server}.json").unlink(missing_ok=True)


def ledgers(shared_memory: Path = SHARED_MEMORY) -> list[tuple[Path, dict]]:
    """Every ledger this user wrote, (its path, what it names). Another user's is
    ignored: /dev/shm is open to all, and a planted ledger must not steer removals."""
    found = []
    for path in sorted(shared_memory.glob(f"{LEDGER_PREFIX}*.json")):
        try:
            if path.lstat().st_uid != os.geteuid() or not path.is_file():
                continue
            ledger = json.loads(path.read_text())
            names = [
                n for n in ledger["names"] if "/" not in n and n not in ("", ".", "..")
            ]
            found.append((path, ledger | {"names": names}))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


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
            mine = status.st_uid == os.geteuid()
            if not mine or file_key(status.st_dev, status.st_ino) in held:
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
        with contextlib.suppress(FileNotFoundError):
            if os.readlink(link).startswith(prefix):
                status = os.stat(link)
                found.add(file_key(status.st_dev, status.st_ino))
    return found


def file_key(device: int, inode: int) -> tuple[int, int, int]:
    return os.major(device), os.minor(device), inode


def namespace_pid(pid: int) -> int | None:
    """The pid a host process has inside its own pid namespace (NSpid's last field)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return None


def segment_creator(name: str) -> int | None:
    """The creator pid an SGLang segment's name holds (a pid of its namespace)."""
    parts = name.split("_")
    if len(parts) >= 5 and parts[-2].isdigit():
        return int(parts[-2])
    return None
