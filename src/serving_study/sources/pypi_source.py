"""Fetching a pinned SGLang release from PyPI: the wheel pip picks for this Python.

A release has one wheel per Python version and platform, so the config pins it by
one sha256 or by a list of them (``pypi.sha256``), as pip's repeated ``--hash``
does: the wheel pip picks must have one of them. A wheel cached in the download
folder is tried first, without the network, and a freshly downloaded one is kept
there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from serving_study.files import file_sha256
from serving_study.sources.package_extraction import extract_package_sources
from serving_study.sources.source_errors import (
    SourceMismatch,
    SourceUnavailable,
    last_line,
)

# Seconds before a download counts as unreachable rather than slow.
PIP_DOWNLOAD_TIMEOUT_S = 1800


def fetch_pypi_source(
    record: dict,
    staging: Path,
    download_dir: Path | None,
    python_version: str | None = None,
) -> dict:
    """Lay out the package of the pinned wheel in ``staging``, keeping the wheel,
    less what the pin's ``leave_out`` names. The wheel is the one for this Python,
    or for CPython ``python_version`` on Linux x86-64 (a host the tree is made
    for elsewhere: docs/gpu-hosts.md)."""
    pin = record["pypi"]
    package, version = pin["package"], pin["version"]
    archive_dir = staging / "archive"
    archive_dir.mkdir()
    wheel = _download_wheel(
        record["name"], package, version, archive_dir, download_dir, python_version
    )
    digest = file_sha256(wheel)
    pinned = pinned_digests(pin)
    if pinned and digest not in pinned:
        cached = ""
        if download_dir is not None and (Path(download_dir) / wheel.name).is_file():
            cached = (
                f" If the cached {Path(download_dir) / wheel.name} is the one that "
                "changed, remove it to download the wheel again."
            )
        raise SourceMismatch(
            f"source {record['name']!r}: {wheel.name} has sha256 {digest}, which is "
            f"not among the sha256 the config pins for {package} {version}: "
            f"{', '.join(pinned)}. Each wheel of a release (one per Python version "
            "and platform) has its own sha256: add the one of the wheel for this "
            f"Python ({sys.version.split()[0]}) from PyPI's index, or drop the pin."
            + cached
        )
    if download_dir is not None:
        _keep_in_cache(wheel, Path(download_dir))
    leave_out = tuple(pin.get("leave_out", ()))
    left_out = extract_package_sources(wheel, staging / "python", leave_out)
    return {
        "kind": "pypi",
        "package": package,
        "version": version,
        "file": wheel.name,
        "sha256": digest,
        **({"files_left_out": left_out} if leave_out else {}),
    }


def pinned_digests(pin: dict) -> list[str]:
    """The sha256 a ``pypi`` pin accepts (lower case), from one digest or a list."""
    pinned = pin.get("sha256") or []
    return [
        digest.lower() for digest in ([pinned] if isinstance(pinned, str) else pinned)
    ]


# The platforms a wheel for another Python may be built for: Linux x86-64 with
# glibc 2.17 or newer (SGLang's own wheels are manylinux_2_34).
OTHER_PYTHON_PLATFORMS = tuple(
    f"manylinux_2_{minor}_x86_64" for minor in range(39, 16, -1)
)


def _download_wheel(
    name: str,
    package: str,
    version: str,
    into: Path,
    download_dir: Path | None,
    python_version: str | None = None,
) -> Path:
    """Download the wheel of ``package==version`` that suits this Python (or
    CPython ``python_version``) into ``into`` (from ``download_dir`` first,
    without the network)."""
    requirement = f"{package}=={version}"
    target = []
    if python_version is not None:
        target = ["--python-version", python_version, "--implementation", "cp"]
        target += [f"--platform={tag}" for tag in OTHER_PYTHON_PLATFORMS]
    sources = []
    if download_dir is not None and Path(download_dir).is_dir():
        sources.append(["--no-index", "--find-links", str(download_dir)])
    sources.append([])
    failures = []
    for index_options in sources:
        for leftover in into.iterdir():
            leftover.unlink()
        command = [sys.executable, "-m", "pip", "download", "--no-deps"]
        command += ["--only-binary=:all:", "--disable-pip-version-check", "--no-input"]
        command += ["--retries=2", "--timeout=30", *target, *index_options]
        command += ["--dest", str(into), "--", requirement]
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
    return prefix + last_line(output)


def _keep_in_cache(wheel: Path, download_dir: Path) -> None:
    download_dir.mkdir(parents=True, exist_ok=True)
    cached = download_dir / wheel.name
    if cached.is_file() and file_sha256(cached) == file_sha256(wheel):
        return
    partial = download_dir / f".{wheel.name}.partial-{os.getpid()}"
    shutil.copyfile(wheel, partial)
    os.replace(partial, cached)
