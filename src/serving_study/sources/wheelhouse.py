"""A wheelhouse for an image built on the Debian base: every wheel it installs, offline.

Nothing inside ``docker build`` comes from PyPI. There an unpinned ``torch`` is a
multi-GB CUDA build, and GPU clusters are often air-gapped; so the host downloads
the wheels once with ``pip download`` and the image installs them with
``pip install --no-index --find-links``. The wheels are chosen for the image's
Python and glibc (Debian bookworm: CPython 3.11, glibc 2.36), not the host's.
``wheelhouse.json`` lists every wheel's sha256, and ``files`` the sha256 of every
file the image takes (wheels, requirements, constraints), checked when an image's
build context takes them. Two kinds of requirements:

* open (the embedded engine's ``envs/embedded-requirements.txt``): the wheels and
  their dependencies; dependencies the requirements do not pin are held at the
  versions installed in the Python running this code (a constraints file), so the
  engine in a container runs the same packages as on the host; CUDA wheels are
  refused (the embedded image wants the CPU build of torch);
* closed (the CPU SGLang runtime's ``envs/sglang-cpu/requirements.lock``): every
  package pinned, so exactly one wheel per line is downloaded (``--no-deps``) and
  installed the same way; what the lock names is what comes in, CUDA wheels
  included (PyPI's torch build imports its CUDA libraries even on a CPU).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from serving_study.files import file_sha256, staged_directory
from serving_study.sources.hashed_lock import (
    LockNotClosed,
    canonical_name,
    read_hashed_lock,
)
from serving_study.sources.recorded_files import file_digests, require_unchanged

logger = logging.getLogger(__name__)

# Never constrained: the package itself (installed from the build context).
NOT_CONSTRAINED = ("serving-study",)
# Wheels that mean a CUDA build of torch came in (gigabytes, useless on a CPU image).
CUDA_WHEEL = re.compile(r"^(nvidia[_-]|triton-|cuda[_-])", re.IGNORECASE)
LEGACY_MANYLINUX = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
DOWNLOAD_TIMEOUT_S = 1800
MANIFEST = "wheelhouse.json"


class WheelhouseFailed(RuntimeError):
    """The wheels could not be downloaded as asked; the message says why."""


def manylinux_platforms(glibc_version: str, machine: str = "x86_64") -> list[str]:
    """Every manylinux platform tag that runs on this glibc, newest first.

    pip download takes the tags literally (it does not add older manylinux
    versions itself), so all of them are passed.
    """
    major, minor = (int(part) for part in glibc_version.split("."))
    if major != 2 or minor < 5:
        raise ValueError(
            f"glibc {glibc_version} is not a manylinux glibc (2.5 or later)"
        )
    tags = [f"manylinux_2_{version}" for version in range(minor, 4, -1)]
    tags += [name for name, needed in LEGACY_MANYLINUX.items() if minor >= needed]
    return [f"{tag}_{machine}" for tag in tags]


def installed_versions() -> dict[str, str]:
    """Canonical name -> version of every distribution in the running Python."""
    versions: dict[str, str] = {}
    for distribution in metadata.distributions():
        name = distribution.metadata["Name"]
        if name and distribution.version:
            versions.setdefault(canonical_name(name), distribution.version)
    return versions


def constraints_from(versions: dict[str, str]) -> list[str]:
    """``name==version`` lines, one per distribution, the package itself left out."""
    return [
        f"{name}=={version}"
        for name, version in sorted(versions.items())
        if name not in NOT_CONSTRAINED
    ]


def lock_pins(lock_lines: list[str]) -> dict[str, str]:
    """Canonical name -> version of each package of a closed, hashed lock
    (``hashed_lock``)."""
    try:
        packages = read_hashed_lock("\n".join(lock_lines), "the lock")
    except LockNotClosed as error:
        raise WheelhouseFailed(
            f"a closed lock pins and hashes each package: {error}"
        ) from None
    return {name: package.version for name, package in packages.items()}


def download_command(
    *,
    requirements_file: Path,
    constraints_file: Path | None,
    dest: Path,
    python_version: str,
    glibc_version: str,
) -> list[str]:
    """``pip download`` of the requirements as binary wheels for CPython
    ``python_version`` on ``glibc_version``; ``constraints_file`` None means the
    requirements are a closed lock: no dependency is looked for (``--no-deps``)."""
    major, minor = python_version.split(".")
    command = [sys.executable, "-m", "pip", "download", "--dest", str(dest)]
    command += ["--only-binary=:all:", "--implementation", "cp"]
    command += ["--python-version", python_version, "--abi", f"cp{major}{minor}"]
    for platform in manylinux_platforms(glibc_version):
        command += ["--platform", platform]
    command += ["--requirement", str(requirements_file)]
    if constraints_file is None:
        return command + ["--no-deps", "--require-hashes"]
    return command + ["--constraint", str(constraints_file)]


def make_wheelhouse(
    requirements: Path,
    dest: Path,
    *,
    python_version: str,
    glibc_version: str,
    log_path: Path | None = None,
    closed: bool = False,
) -> dict:
    """Download the wheels into ``dest`` (replaced whole) and return its manifest.

    ``dest`` then holds the wheels, ``requirements.txt`` (a copy of
    ``requirements``), ``constraints.txt`` (open requirements only) and
    ``wheelhouse.json``. ``closed``: ``requirements`` is a lock (see the module's
    docstring), checked to be pinned before and matched wheel for wheel after.
    """
    pins = lock_pins(Path(requirements).read_text().splitlines()) if closed else {}
    with staged_directory(Path(dest)) as staging:
        shutil.copyfile(requirements, staging / "requirements.txt")
        constraints = None
        if not closed:
            constraints = staging / "constraints.txt"
            constraints.write_text(
                "\n".join(constraints_from(installed_versions())) + "\n"
            )
        command = download_command(
            requirements_file=staging / "requirements.txt",
            constraints_file=constraints,
            dest=staging,
            python_version=python_version,
            glibc_version=glibc_version,
        )
        finished = subprocess.run(
            command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S
        )
        output = finished.stdout + finished.stderr
        if log_path is not None:
            Path(log_path).write_text(" ".join(command) + "\n" + output)
        if finished.returncode != 0:
            tail = "\n".join(output.splitlines()[-15:])
            raise WheelhouseFailed(
                f"pip download of {requirements} for CPython {python_version} "
                f"(glibc {glibc_version}) failed:\n{tail}"
            )
        wheels = sorted(staging.glob("*.whl"))
        if closed:
            refuse_wheels_off_the_lock(wheels, pins)
        else:
            refuse_cuda_wheels(wheels)
        manifest = {
            "requirements": requirements.read_text().splitlines(),
            "closed": closed,
            "python_version": python_version,
            "glibc_version": glibc_version,
            "wheels": [
                {"file": wheel.name, "sha256": file_sha256(wheel), "bytes": size}
                for wheel in wheels
                for size in [wheel.stat().st_size]
            ],
            "files": wheelhouse_files(staging),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def wheelhouse_files(wheelhouse: Path) -> dict[str, str]:
    """The sha256 of every file of a wheelhouse but its manifest."""
    return file_digests(wheelhouse, leave_out=(MANIFEST,))


def require_wheelhouse_unchanged(wheelhouse: Path) -> None:
    """Raise RecordedFileChanged naming a file of ``wheelhouse`` that is not as its
    manifest recorded it (changed, added or removed since)."""
    wheelhouse = Path(wheelhouse)
    manifest = json.loads((wheelhouse / MANIFEST).read_text())
    if "files" not in manifest:
        logger.warning(
            "%s was made before its files were recorded, so they are not checked; "
            "remove %s to download it again",
            wheelhouse / MANIFEST,
            wheelhouse,
        )
        return
    require_unchanged(
        wheelhouse,
        manifest["files"],
        wheelhouse_files(wheelhouse),
        again="download it again",
    )


def refuse_cuda_wheels(wheels: list[Path]) -> None:
    cuda = [wheel.name for wheel in wheels if CUDA_WHEEL.match(wheel.name)]
    if cuda:
        raise WheelhouseFailed(
            f"the wheelhouse would hold CUDA wheels ({', '.join(cuda[:4])}, ...): pip "
            "found PyPI's CUDA build of torch, which the CPU-only embedded image does "
            "not need. Put the CPU wheel (torch-<version>+cpu-...whl, from "
            "https://download.pytorch.org/whl/cpu) in a directory and point "
            "PIP_FIND_LINKS at it, then run the rule again."
        )


def refuse_wheels_off_the_lock(wheels: list[Path], pins: dict[str, str]) -> None:
    """Exactly one wheel per line of the lock, none besides."""
    # A wheel's file name starts with its distribution's: torch-2.14.1-...whl.
    names = [canonical_name(wheel.name.split("-", 1)[0]) for wheel in wheels]
    missing = sorted(set(pins) - set(names))
    extra = sorted({name for name in names if name not in pins})
    doubled = sorted({name for name in names if names.count(name) > 1})
    if missing or extra or doubled:
        raise WheelhouseFailed(
            "the wheelhouse does not match the lock: "
            f"missing {missing or 'none'}, not in the lock {extra or 'none'}, "
            f"more than one wheel {doubled or 'none'}"
        )
