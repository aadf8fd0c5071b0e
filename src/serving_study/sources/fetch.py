"""Fetch one pinned SGLang source into a cache directory and record what was fetched.

A source is named in the config by one of three records:

- ``{"name", "pypi": {"package", "version", "sha256"?}}``: the release wheel that pip
  picks for the running Python (``pip download --only-binary``);
- ``{"name", "git": {"url", "commit"}}``: one full 40-hex commit of a repository;
- ``{"name", "path": "..."}``: a local copy, either a wheel/sdist file or a directory
  that holds ``python/sglang/...`` or ``sglang/...``.

Whatever the kind, the fetched tree is laid out as SGLang's repository is,
``dest/python/sglang/...``, so that one patch (paths ``a/python/sglang/...``) applies
to every kind. A git source keeps its whole ``python/`` folder as committed; the other
kinds keep only the package's ``.py`` files (compiled extensions and data files stay
in the wheel). A fetched archive is kept in ``dest/archive/``.

``dest/source.json`` records the identity (kind, name, archive sha256 or commit, and a
sha256 over the laid-out tree). Nothing half-done is ever left at ``dest``: the tree is
built in a staging directory beside it and renamed into place at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

logger = logging.getLogger(__name__)

IDENTITY_FILE = "source.json"
PACKAGE = "sglang"
FULL_COMMIT = re.compile(r"[0-9a-f]{40}")
# What a git source may pin (fullmatch): a sha, never a value git reads as an option.
PINNED_COMMIT = re.compile(r"[0-9a-f]{7,40}")

# Seconds before a network step counts as unreachable rather than slow.
GIT_PROBE_TIMEOUT_S = 60
GIT_FETCH_TIMEOUT_S = 1800
PIP_DOWNLOAD_TIMEOUT_S = 1800


class SourceError(Exception):
    """A source could not be fetched as the config pins it."""


class SourceUnavailable(SourceError):
    """The source cannot be reached (offline, wrong URL, missing local path)."""


class SourceMismatch(SourceError):
    """The source was reached but is not what the config pins (sha256, commit)."""


def fetch_source(record: dict, dest: Path, download_dir: Path | None = None) -> dict:
    """Lay out the source named by ``record`` at ``dest`` and return its identity.

    When ``dest`` already holds a tree fetched from the same pinned record (pypi or
    git), that tree's identity is returned without fetching again; a local path,
    which may have changed, is always copied afresh. ``download_dir`` is an optional
    cache of downloaded wheels: a compatible wheel found there is used without the
    network, and a freshly downloaded one is stored there.
    """
    # Absolute: git and pip run in temporary folders of their own.
    dest = Path(dest).absolute()
    if download_dir is not None:
        download_dir = Path(download_dir).absolute()
    cached = read_identity(dest)
    if cached is not None and cached.get("record") == record and "path" not in record:
        return cached

    if "pypi" in record:
        fetch = _fetch_pypi
    elif "git" in record:
        fetch = _fetch_git
    elif "path" in record:
        fetch = _fetch_path
    else:
        raise ValueError(
            f"source record {record.get('name')!r} names no kind: give one of "
            "'pypi', 'git' or 'path'"
        )
    with staged_directory(dest) as staging:
        details = fetch(record, staging, download_dir)
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
    return identity


def read_identity(tree: Path) -> dict | None:
    """Return the identity stored in a fetched tree, or None if there is none."""
    path = Path(tree) / IDENTITY_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


# --- the three kinds -------------------------------------------------------------


def _fetch_pypi(record: dict, staging: Path, download_dir: Path | None) -> dict:
    pin = record["pypi"]
    package, version = pin["package"], pin["version"]
    archive_dir = staging / "archive"
    archive_dir.mkdir()
    wheel = _download_wheel(record["name"], package, version, archive_dir, download_dir)
    digest = file_sha256(wheel)
    expected = pin.get("sha256")
    if expected and digest != expected.lower():
        raise SourceMismatch(
            f"source {record['name']!r}: {wheel.name} has sha256 {digest}, but the "
            f"config pins {expected}. A sha256 pins one wheel file, and wheels differ "
            "per Python version and platform: pin the sha256 of the wheel for this "
            f"Python ({sys.version.split()[0]}), or drop the pin."
        )
    if download_dir is not None:
        _keep_in_cache(wheel, Path(download_dir))
    _extract_package_sources(wheel, staging / "python")
    return {
        "kind": "pypi",
        "package": package,
        "version": version,
        "file": wheel.name,
        "sha256": digest,
    }


def _fetch_git(record: dict, staging: Path, download_dir: Path | None) -> dict:
    pin = record["git"]
    url, commit = pin["url"], pin["commit"]
    name = record["name"]
    if not PINNED_COMMIT.fullmatch(commit):
        raise SourceMismatch(
            f"source {name!r}: git.commit {commit!r} is not a commit sha (7 to 40 "
            "hex digits)"
        )
    with tempfile.TemporaryDirectory(dir=staging.parent, prefix=".git-") as work:
        repository = Path(work)
        remote = _git_remote(url)
        _run_git(["init", "--quiet"], repository)
        _require_reachable(f"source {name!r}", remote, repository)
        # A server gives a commit by sha only when the whole sha is asked for; an
        # abbreviated one (all the study published for B1's base) needs the history.
        fetched = (
            _try_git(
                ["fetch", "--quiet", "--depth=1", "--", remote, commit], repository
            )
            if FULL_COMMIT.fullmatch(commit)
            else None
        )
        if fetched is None or fetched.returncode != 0:
            # Some servers refuse a commit asked for by sha: take all branches and tags.
            _try_git(
                [
                    "fetch",
                    "--quiet",
                    "--",
                    remote,
                    "+refs/heads/*:refs/remotes/source/*",
                    "+refs/tags/*:refs/tags/*",
                ],
                repository,
                timeout=GIT_FETCH_TIMEOUT_S,
            )
        resolved = _try_git(
            ["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], repository
        )
        full_commit = resolved.stdout.strip()
        if resolved.returncode != 0 or not full_commit.startswith(commit):
            raise SourceMismatch(
                f"source {name!r}: commit {commit} was not found in {url}. Check the "
                "commit in the config: it must be a sha (best all 40 digits) that "
                "exists there."
            )
        if full_commit != commit:
            logger.warning(
                "source %r: abbreviated commit %s resolved to %s; pin the full sha",
                name,
                commit,
                full_commit,
            )
        commit = full_commit
        if _try_git(
            ["cat-file", "-e", f"{commit}:python/{PACKAGE}"], repository
        ).returncode:
            raise SourceMismatch(
                f"source {name!r}: commit {commit} of {url} has no python/{PACKAGE} "
                "folder. Is this SGLang's repository?"
            )
        snapshot = repository / "python.tar"
        _run_git(
            ["archive", "--format=tar", f"--output={snapshot}", commit, "python"],
            repository,
            timeout=GIT_FETCH_TIMEOUT_S,
        )
        with tarfile.open(snapshot) as tar:
            try:
                tar.extractall(staging, filter="data")
            except tarfile.FilterError as refused:
                raise SourceMismatch(
                    f"source {name!r}: the git archive of {commit} in {url} has a "
                    f"member that would leave the tree: {refused}"
                ) from None
    return {"kind": "git", "url": url, "commit": commit}


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
        _copy_package_sources(_package_directory(name, local), staging / "python")
        return {"kind": "path", "path": str(local), "sha256": None}
    archive_dir = staging / "archive"
    archive_dir.mkdir()
    kept = archive_dir / local.name
    shutil.copy2(local, kept)
    _extract_package_sources(kept, staging / "python")
    return {"kind": "path", "path": str(local), "sha256": file_sha256(kept)}


# --- pull requests ---------------------------------------------------------------


@dataclass(frozen=True)
class PullRequestDiff:
    """A pull request's change to ``python/``, taken against its merge base."""

    url: str
    number: int
    head_commit: str
    merge_base: str
    text: str


def fetch_pull_request_diff(
    git_url: str, number: int, base_commit: str
) -> PullRequestDiff:
    """Fetch pull request ``number`` and diff it against its merge base with a commit.

    Only the ``python/`` folder is diffed, the part of the repository a source tree
    holds. The head commit is recorded because a pull request's head moves.
    """
    where = f"pull request #{number} of {git_url}"
    pull_ref = f"refs/pull/{number}/head"
    with tempfile.TemporaryDirectory(prefix="pull-request-") as work:
        repository = Path(work)
        remote = _git_remote(git_url)
        _run_git(["init", "--quiet", "--bare"], repository)
        _require_reachable(where, remote, repository)
        # A blobless fetch: history and trees now, file contents only as diff needs.
        for setting in (
            ["remote.origin.url", remote],
            ["remote.origin.promisor", "true"],
            ["remote.origin.partialclonefilter", "blob:none"],
        ):
            _run_git(["config", *setting], repository)
        fetched = _try_git(
            [
                "fetch",
                "--quiet",
                "--filter=blob:none",
                "origin",
                f"+{pull_ref}:{pull_ref}",
            ],
            repository,
            timeout=GIT_FETCH_TIMEOUT_S,
        )
        if fetched.returncode != 0:
            raise SourceMismatch(
                f"{where} could not be fetched ({_last_line(fetched.stderr)}). Check "
                "the pull request number."
            )
        has_base = (
            _try_git(
                ["cat-file", "-e", f"{base_commit}^{{commit}}"], repository
            ).returncode
            == 0
        )
        if not has_base:
            _try_git(
                ["fetch", "--quiet", "--filter=blob:none", "--", "origin", base_commit],
                repository,
                timeout=GIT_FETCH_TIMEOUT_S,
            )
        head = _run_git(["rev-parse", pull_ref], repository).stdout.strip()
        merge_base = _try_git(["merge-base", base_commit, head], repository)
        if merge_base.returncode != 0:
            raise SourceMismatch(
                f"{where}: no merge base with commit {base_commit}. Is that commit "
                "in the same repository?"
            )
        merge_base_commit = merge_base.stdout.strip()
        diff = _run_git(
            [
                "diff",
                "--no-ext-diff",
                "--no-color",
                "--binary",
                "--src-prefix=a/",
                "--dst-prefix=b/",
                merge_base_commit,
                head,
                "--",
                "python",
            ],
            repository,
            timeout=GIT_FETCH_TIMEOUT_S,
        )
    return PullRequestDiff(
        url=git_url,
        number=number,
        head_commit=head,
        merge_base=merge_base_commit,
        text=diff.stdout,
    )


# --- files and trees -------------------------------------------------------------


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


def _extract_package_sources(archive: Path, python_dir: Path) -> None:
    """Copy the package inside a wheel or sdist to ``python_dir``: every file but
    bytecode, so a wheel's compiled extensions and data files come along (a real
    server imports them; the embedded engine needs only the ``.py`` files).

    The package is found wherever ``sglang/__init__.py`` sits nearest the archive's
    root: at the root of a wheel, under ``sglang-<version>/`` in an sdist, under
    ``python/`` in a snapshot of the repository.
    """
    with _opened_archive(archive) as (names, read):
        markers = [
            name.removesuffix(f"{PACKAGE}/__init__.py")
            for name in names
            if name == f"{PACKAGE}/__init__.py"
            or name.endswith(f"/{PACKAGE}/__init__.py")
        ]
        if not markers:
            raise SourceMismatch(
                f"{archive.name} holds no {PACKAGE}/__init__.py: it is not an SGLang "
                "wheel or sdist."
            )
        prefix = min(markers, key=len) + f"{PACKAGE}/"
        depth = len(PurePosixPath(prefix).parts)
        for name in names:
            if not name.startswith(prefix) or name.endswith(".pyc"):
                continue
            # By parts: "sglang//etc/x" is sglang/etc/x, never /etc/x.
            relative = PurePosixPath(name).parts[depth:]
            if not relative:
                continue
            target = python_dir.joinpath(PACKAGE, *relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(read(name))


@contextlib.contextmanager
def _opened_archive(archive: Path) -> Iterator[tuple[list[str], Callable]]:
    """Yield the names of a zip or tar archive's regular files and a reader of one.

    Every member is checked first (``_refuse_leaving_member``), so an archive with
    one that would leave the tree is refused before anything is written.
    """
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as bundle:
            names = []
            for info in bundle.infolist():
                # A zip stores a symlink as a file holding its target.
                if stat.S_ISLNK(info.external_attr >> 16):
                    target = bundle.read(info).decode(errors="replace")
                    _refuse_leaving_member(archive, info.filename, symlink=target)
                    continue
                _refuse_leaving_member(archive, info.filename)
                if not info.is_dir():
                    names.append(info.filename)
            yield names, bundle.read
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as bundle:
            for member in bundle.getmembers():
                _refuse_leaving_member(
                    archive,
                    member.name,
                    symlink=member.linkname if member.issym() else None,
                    hardlink=member.linkname if member.islnk() else None,
                )
            members = {
                member.name.removeprefix("./"): member
                for member in bundle.getmembers()
                if member.isfile()
            }
            yield list(members), lambda name: bundle.extractfile(members[name]).read()
    else:
        raise SourceMismatch(
            f"{archive} is neither a zip (wheel) nor a tar (sdist) archive."
        )


def _refuse_leaving_member(
    archive: Path,
    name: str,
    symlink: str | None = None,
    hardlink: str | None = None,
) -> None:
    """Raise SourceMismatch, naming the archive and the member, when the member has
    an absolute path or a ``..`` part, or is a link (a symlink's target is relative
    to its folder, a hard link's to the archive's root) to outside the tree."""
    why = None
    if name.startswith("/"):
        why = "its path is absolute"
    elif ".." in PurePosixPath(name).parts:
        why = "its path has a '..' part"
    else:
        for target, base in ((symlink, posixpath.dirname(name)), (hardlink, "")):
            if target is None:
                continue
            resolved = posixpath.normpath(posixpath.join(base, target))
            if target.startswith("/") or resolved.split("/")[0] == "..":
                why = f"it links to {target!r}, outside the archive's tree"
    if why:
        raise SourceMismatch(
            f"{archive.name} has an unsafe member {name!r} ({why}); nothing was "
            "extracted"
        )


def _package_directory(name: str, local: Path) -> Path:
    for candidate in (local / "python" / PACKAGE, local / PACKAGE, local):
        if candidate.name == PACKAGE and (candidate / "__init__.py").is_file():
            return candidate
    raise SourceMismatch(
        f"source {name!r}: {local} holds neither python/{PACKAGE}/__init__.py nor "
        f"{PACKAGE}/__init__.py. Point 'path:' at the repository, at its python/ "
        "folder, or at a wheel."
    )


def _copy_package_sources(package: Path, python_dir: Path) -> None:
    """Copy the package's files but bytecode (see ``_extract_package_sources``)."""
    for source in package.rglob("*"):
        if not source.is_file() or "__pycache__" in source.parts:
            continue
        if source.suffix == ".pyc":
            continue
        target = python_dir / PACKAGE / source.relative_to(package)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


# --- pip -------------------------------------------------------------------------


def _download_wheel(
    name: str,
    package: str,
    version: str,
    into: Path,
    download_dir: Path | None,
) -> Path:
    """Download the wheel of ``package==version`` that suits this Python into ``into``.

    A wheel cached in ``download_dir`` is tried first, without the network.
    """
    requirement = f"{package}=={version}"
    sources = []
    if download_dir is not None and Path(download_dir).is_dir():
        sources.append(["--no-index", "--find-links", str(download_dir)])
    sources.append([])
    failures = []
    for index_options in sources:
        for leftover in into.iterdir():
            leftover.unlink()
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-input",
            "--retries=2",
            "--timeout=30",
            *index_options,
            "--dest",
            str(into),
            "--",
            requirement,
        ]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=PIP_DOWNLOAD_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            failures.append(f"pip download timed out after {PIP_DOWNLOAD_TIMEOUT_S} s")
            continue
        wheels = sorted(into.glob("*.whl"))
        if result.returncode == 0 and len(wheels) == 1:
            return wheels[0]
        failures.append(_pip_failure(result.stderr or result.stdout))
    raise SourceUnavailable(
        f"source {name!r}: could not download {requirement} from PyPI "
        f"({failures[-1]}). If this machine is offline, download the wheel elsewhere "
        "and point the config at it with 'path: /the/wheel.whl' instead of 'pypi:'."
    )


def _pip_failure(output: str) -> str:
    """pip's last error, saying so when the index could not be reached at all."""
    unreachable = any(
        sign in output
        for sign in ("NewConnectionError", "Failed to establish", "Could not fetch URL")
    )
    prefix = "the package index could not be reached; " if unreachable else ""
    return prefix + _last_line(output)


def _keep_in_cache(wheel: Path, download_dir: Path) -> None:
    download_dir.mkdir(parents=True, exist_ok=True)
    cached = download_dir / wheel.name
    if cached.is_file() and file_sha256(cached) == file_sha256(wheel):
        return
    partial = download_dir / f".{wheel.name}.partial-{os.getpid()}"
    shutil.copyfile(wheel, partial)
    os.replace(partial, cached)


# --- git -------------------------------------------------------------------------


def _git_environment() -> dict:
    """The environment for git: never prompt, never pick up a caller's repository."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")
    }
    environment["GIT_TERMINAL_PROMPT"] = "0"
    return environment


def _try_git(
    arguments: list[str],
    cwd: Path,
    timeout: float = GIT_PROBE_TIMEOUT_S,
) -> subprocess.CompletedProcess:
    """Run git and return the result whatever its exit status."""
    try:
        return subprocess.run(
            ["git", *arguments],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_git_environment(),
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(
            ["git", *arguments], 124, "", f"timed out after {timeout} s"
        )


def _run_git(
    arguments: list[str],
    cwd: Path,
    timeout: float = GIT_PROBE_TIMEOUT_S,
) -> subprocess.CompletedProcess:
    """Run git and raise SourceError if it fails."""
    result = _try_git(arguments, cwd, timeout=timeout)
    if result.returncode != 0:
        raise SourceError(
            f"git {' '.join(arguments)} failed: {_last_line(result.stderr)}"
        )
    return result


def _git_remote(url: str) -> str:
    """Return ``url`` with a local path made absolute (git runs in a temp directory)."""
    local = Path(url).expanduser()
    if "://" not in url and local.exists():
        return str(local.resolve())
    return url


def _require_reachable(what: str, url: str, repository: Path) -> None:
    probe = _try_git(["ls-remote", "--quiet", "--", url, "HEAD"], repository)
    if probe.returncode != 0:
        raise SourceUnavailable(
            f"{what}: cannot reach {url} ({_last_line(probe.stderr)}). If "
            "this machine is offline, make a local copy elsewhere (a clone, or a "
            "wheel) and point the config at it with 'path:' (or 'git: {url: "
            "/local/clone}')."
        )


def _last_line(output: str) -> str:
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
