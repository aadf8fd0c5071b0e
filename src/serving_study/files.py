"""Digests of files and trees, and writes that never leave anything half-done.

On the ground floor (it imports nothing of this package), where the workloads and
the sources can both use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def file_sha256(path: Path) -> str:
    """Return the sha256 of one file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_sha256(root: Path) -> str:
    """Return one sha256 over every file's relative path and content under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        digest.update(f"{relative}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()


@contextlib.contextmanager
def staged_directory(dest: Path) -> Iterator[Path]:
    """Yield an empty staging directory beside ``dest``; on success it becomes ``dest``.

    On an exception the staging directory is removed and ``dest`` is untouched. An
    existing ``dest`` is replaced as a whole.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.staging-"))
    try:
        yield staging
        if dest.exists():
            retired = Path(
                tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old-")
            )
            os.rename(dest, retired / dest.name)
            os.rename(staging, dest)
            shutil.rmtree(retired)
        else:
            os.rename(staging, dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def write_json(path: Path, value: dict) -> None:
    """Write ``value`` as indented JSON with a trailing newline."""
    Path(path).write_text(json.dumps(value, indent=2, sort_keys=False) + "\n")
