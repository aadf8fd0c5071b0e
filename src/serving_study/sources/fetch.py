"""Fetch one pinned SGLang source into a cache directory and record what was fetched.

A source is named in the config by one of three records:

- ``{"name", "pypi": {"package", "version", "sha256"?, "leave_out"?}}``: the release
  wheel that pip picks for the running Python (``pip download --only-binary``),
  less the package paths ``leave_out`` names;
- ``{"name", "git": {"url", "commit"}}``: one full 40-hex commit of a repository;
- ``{"name", "path": "..."}``: a local copy, either a wheel/sdist file or a directory
  that holds ``python/sglang/...`` or ``sglang/...``.

Every kind is laid out as SGLang's repository is, ``dest/python/sglang/...``, so that
one patch (paths ``a/python/sglang/...``) applies to all: a git source's whole
``python/`` folder as committed, the other kinds' package files but bytecode (a
fetched archive is kept in ``dest/archive/``). ``dest/source.json`` records the
identity (kind, name, archive sha256 or commit, and a sha256 over the laid-out tree),
``dest/files.json`` the sha256 of every file. The tree is built beside ``dest`` and
renamed into place, so nothing half-done is ever left there.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

from serving_study.files import file_sha256, staged_directory, tree_sha256, write_json
from serving_study.sources.git_source import fetch_git_source
from serving_study.sources.package_extraction import (
    PACKAGE,
    copy_package_sources,
    extract_package_sources,
    package_directory,
)
from serving_study.sources.pypi_source import fetch_pypi_source
from serving_study.sources.recorded_files import file_digests, require_unchanged
from serving_study.sources.source_errors import SourceUnavailable

IDENTITY_FILE = "source.json"
FILES_RECORD = "files.json"


def fetch_source(
    record: dict,
    dest: Path,
    download_dir: Path | None = None,
    python_version: str | None = None,
) -> dict:
    """Lay out the source named by ``record`` at ``dest`` and return its identity.

    When ``dest`` already holds a tree fetched from the same pinned record (pypi or
    git), that tree's identity is returned without fetching again, once every file
    is found as recorded (RecordedFileChanged names one that is not); a local path,
    which may have changed, is always copied afresh. ``download_dir`` is an optional
    cache of downloaded wheels, ``python_version`` the CPython a pypi source's
    wheel is for when not this one (``pypi_source``).
    """
    # Absolute: git and pip run in temporary folders of their own.
    dest = Path(dest).absolute()
    if download_dir is not None:
        download_dir = Path(download_dir).absolute()
    cached = read_identity(dest)
    # A tree fetched before its files were recorded is fetched again.
    recorded = dest / FILES_RECORD
    if (
        cached is not None
        and cached.get("record") == record
        and "path" not in record
        and recorded.is_file()
    ):
        recorded_files = json.loads(recorded.read_text())
        require_unchanged(
            dest, recorded_files, _tree_files(dest), again="fetch it again"
        )
        return cached

    fetchers = {"pypi": fetch_pypi_source, "git": fetch_git_source, "path": _fetch_path}
    kind = next((name for name in fetchers if name in record), None)
    if kind is None:
        raise ValueError(
            f"source record {record.get('name')!r} names no kind: give one of "
            "'pypi', 'git' or 'path'"
        )
    with staged_directory(dest) as staging:
        if kind == "pypi":
            details = fetch_pypi_source(record, staging, download_dir, python_version)
        else:
            details = fetchers[kind](record, staging, download_dir)
        python_root = staging / "python"
        identity = {
            "name": record["name"],
            **details,
            "python_files": sum(1 for _ in python_root.rglob("*.py")),
            "tree_sha256": tree_sha256(python_root),
            "record": record,
            "fetched_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        write_json(staging / IDENTITY_FILE, identity)
        write_json(staging / FILES_RECORD, _tree_files(staging))
    return identity


def _tree_files(tree: Path) -> dict[str, str]:
    """The sha256 of every file of a fetched tree but its two records."""
    return file_digests(tree, leave_out=(IDENTITY_FILE, FILES_RECORD))


def read_identity(tree: Path) -> dict | None:
    """Return the identity stored in a fetched tree, or None if there is none."""
    path = Path(tree) / IDENTITY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _fetch_path(record: dict, staging: Path, download_dir: Path | None) -> dict:
    name = record["name"]
    local = Path(record["path"]).expanduser().resolve()
    if not local.exists():
        raise SourceUnavailable(
            f"source {name!r}: local path {local} does not exist. Point 'path:' at "
            f"a {PACKAGE} wheel or sdist, or at a directory holding python/{PACKAGE} "
            f"or {PACKAGE}."
        )
    if local.is_dir():
        copy_package_sources(package_directory(name, local), staging / "python")
        return {"kind": "path", "path": str(local), "sha256": None}
    archive_dir = staging / "archive"
    archive_dir.mkdir()
    kept = archive_dir / local.name
    shutil.copy2(local, kept)
    extract_package_sources(kept, staging / "python")
    return {"kind": "path", "path": str(local), "sha256": file_sha256(kept)}
