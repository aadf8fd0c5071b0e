"""Taking the ``sglang`` package out of a wheel, an sdist or a local directory.

The package is laid out as SGLang's repository holds it, ``python/sglang/...``. An
archive is checked whole before anything is written: a member with an absolute path,
a ``..`` part, or a link to outside the tree refuses the archive, and so do more
members or bytes than any SGLang release holds (a decompression bomb).
"""

from __future__ import annotations

import contextlib
import fnmatch
import posixpath
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from serving_study.sources.source_errors import SourceMismatch

PACKAGE = "sglang"
# Far above any SGLang wheel or sdist (0.5.23's wheel: ~3,000 files, ~300 MB).
MAX_MEMBERS = 100_000
MAX_BYTES = 8 << 30


def extract_package_sources(
    archive: Path, python_dir: Path, leave_out: tuple[str, ...] = ()
) -> dict[str, int]:
    """Copy the package inside a wheel or sdist to ``python_dir``: every file but
    bytecode, so a wheel's compiled extensions and data files come along (a real
    server imports them; the embedded engine needs only the ``.py`` files).

    The package is found wherever ``sglang/__init__.py`` sits nearest the archive's
    root: at the root of a wheel, under ``sglang-<version>/`` in an sdist, under
    ``python/`` in a snapshot of the repository. ``leave_out`` names paths inside
    the package (``multimodal_gen``, ``srt/rust_extensions/_server.*.so``: a folder,
    a file or a glob) that are not copied; returned is how many files each left out.
    """
    left_out = dict.fromkeys(leave_out, 0)
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
            pattern = left_out_by(PurePosixPath(*relative), leave_out)
            if pattern is not None:
                left_out[pattern] += 1
                continue
            target = python_dir.joinpath(PACKAGE, *relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(read(name))
    return left_out


def left_out_by(relative: PurePosixPath, leave_out: tuple[str, ...]) -> str | None:
    """The first pattern of ``leave_out`` that names ``relative`` or a folder of it."""
    for pattern in leave_out:
        if any(
            fnmatch.fnmatchcase(str(PurePosixPath(*relative.parts[:length])), pattern)
            for length in range(1, len(relative.parts) + 1)
        ):
            return pattern
    return None


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
            infos = bundle.infolist()
            refuse_oversized(archive, len(infos), sum(i.file_size for i in infos))
            yield names, bundle.read
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as bundle:
            listed = bundle.getmembers()
            refuse_oversized(archive, len(listed), sum(m.size for m in listed))
            for member in listed:
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


def refuse_oversized(archive: Path, members: int, size: int) -> None:
    if members > MAX_MEMBERS or size > MAX_BYTES:
        raise SourceMismatch(
            f"{archive.name} holds {members} members and {size} bytes unpacked, more "
            f"than any SGLang release ({MAX_MEMBERS} members, {MAX_BYTES} bytes); "
            "nothing was extracted"
        )


def _refuse_leaving_member(
    archive: Path, name: str, symlink: str | None = None, hardlink: str | None = None
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


def package_directory(name: str, local: Path) -> Path:
    """The ``sglang`` folder of a local checkout, its python/ folder, or itself."""
    for candidate in (local / "python" / PACKAGE, local / PACKAGE, local):
        if candidate.name == PACKAGE and (candidate / "__init__.py").is_file():
            return candidate
    raise SourceMismatch(
        f"source {name!r}: {local} holds neither python/{PACKAGE}/__init__.py nor "
        f"{PACKAGE}/__init__.py. Point 'path:' at the repository, at its python/ "
        "folder, or at a wheel."
    )


def copy_package_sources(package: Path, python_dir: Path) -> None:
    """Copy the package's files but bytecode (see ``extract_package_sources``)."""
    for source in package.rglob("*"):
        bytecode = "__pycache__" in source.parts or source.suffix == ".pyc"
        if bytecode or not source.is_file():
            continue
        target = python_dir / PACKAGE / source.relative_to(package)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
