"""The sha256 of every file of a cached artefact, recorded when it is made and
checked each time it is reused.

A fetched source tree, a wheelhouse, a downloaded model snapshot and the CPU
runtime's venv are made once and reused by later runs. Whatever changed in one
since (a file edited, added or removed) stops the reuse with a message that names
the file and the way out: remove the artefact's directory so that it is made
afresh. Bytecode (``__pycache__``) is never recorded: Python writes it as it imports;
nor is the timestamp file Snakemake adds to a directory a rule outputs.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from serving_study.files import file_sha256
from serving_study.sources.source_errors import SourceError

BYTECODE_DIRECTORY = "__pycache__"
SNAKEMAKE_TIMESTAMP = ".snakemake_timestamp"
# A link is recorded by its target, never followed: a venv's bin/python points at
# the system's Python, and lib64 at lib.
LINK_PREFIX = "link to "


class RecordedFileChanged(SourceError):
    """A cached artefact differs from what was recorded when it was made."""


def file_digests(root: Path, leave_out: tuple[str, ...] = ()) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (a link: ``"link to
    <target>"``), bytecode and the relative paths in ``leave_out`` left out.

    Files are hashed on every CPU at once (hashlib and reads release the GIL): a
    venv of several GB is checked at each reuse.
    """
    root = Path(root)
    digests, to_hash = {}, {}
    for directory, folders, files in os.walk(root):
        here = Path(directory)
        folders[:] = sorted(name for name in folders if name != BYTECODE_DIRECTORY)
        links = [name for name in folders if (here / name).is_symlink()]
        for name in sorted([*files, *links]):
            path = here / name
            relative = path.relative_to(root).as_posix()
            if relative in leave_out or name == SNAKEMAKE_TIMESTAMP:
                continue
            if path.is_symlink():
                digests[relative] = LINK_PREFIX + os.readlink(path)
            else:
                to_hash[relative] = path
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        hashed = pool.map(file_sha256, to_hash.values())
        digests.update(zip(to_hash, hashed, strict=True))
    return dict(sorted(digests.items()))


def require_unchanged(
    root: Path, recorded: dict[str, str], found: dict[str, str], *, again: str
) -> None:
    """Raise RecordedFileChanged naming the first file of ``root`` whose digest
    ``found`` now differs from the one ``recorded``, and how many more differ;
    ``again`` is what deleting ``root`` leads to ("fetch it again")."""
    differences = [
        _difference(Path(root) / relative, recorded.get(relative), found.get(relative))
        for relative in sorted(set(recorded) | set(found))
        if recorded.get(relative) != found.get(relative)
    ]
    if not differences:
        return
    more = len(differences) - 1
    also = f" ({more} more file{'s' if more > 1 else ''} differ too)" if more else ""
    raise RecordedFileChanged(f"{differences[0]}{also}; remove {root} to {again}")


def _difference(path: Path, old: str | None, new: str | None) -> str:
    if old is None:
        return f"{path} was added since the files were recorded ({_shown(new)})"
    if new is None:
        return f"{path} was removed since it was recorded ({_shown(old)})"
    if old.startswith(LINK_PREFIX) or new.startswith(LINK_PREFIX):
        return f"{path} changed since it was recorded ({_shown(old)} -> {_shown(new)})"
    return f"{path} changed since it was recorded (sha256 {old} -> {new})"


def _shown(digest: str) -> str:
    return digest if digest.startswith(LINK_PREFIX) else f"sha256 {digest}"
