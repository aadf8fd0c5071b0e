"""A wheelhouse for the embedded engine's image: every wheel it installs, offline.

Nothing inside ``docker build`` comes from PyPI. There an unpinned ``torch`` is a
multi-GB CUDA build, and GPU clusters are often air-gapped; so the host downloads
the wheels once with ``pip download`` and the image installs them with
``pip install --no-index --find-links``. The wheels are chosen for the image's
Python and glibc (Debian bookworm: CPython 3.11, glibc 2.36), not the host's.
Dependencies the requirements do not pin are held at the versions installed in the
Python running this code (a constraints file), so the engine in a container runs
the same packages as on the host. ``wheelhouse.json`` lists every wheel's sha256.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from serving_study.sources import file_sha256, staged_directory

# Never constrained: the package itself (installed from the build context).
NOT_CONSTRAINED = ("serving-study",)
# Wheels that mean a CUDA build of torch came in (gigabytes, useless on a CPU image).
CUDA_WHEEL = re.compile(r"^(nvidia[_-]|triton-|cuda[_-])", re.IGNORECASE)
LEGACY_MANYLINUX = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
DOWNLOAD_TIMEOUT_S = 1800
MANIFEST = "wheelhouse.json"


class WheelhouseFailed(RuntimeError):
    """The wheels could not be downloaded as asked; the message says why."""


def canonical_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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
    tags = [f"manylinux_2_{version}_{machine}" for version in range(minor, 4, -1)]
    tags += [
        f"{name}_{machine}"
        for name, needed in LEGACY_MANYLINUX.items()
        if minor >= needed
    ]
    return tags


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


def download_command(
    *,
    requirements_file: Path,
    constraints_file: Path,
    dest: Path,
    python_version: str,
    glibc_version: str,
) -> list[str]:
    """``pip download`` of the requirements as binary wheels for CPython
    ``python_version`` on ``glibc_version``."""
    major, minor = python_version.split(".")
    command = [sys.executable, "-m", "pip", "download", "--dest", str(dest)]
    command += ["--only-binary=:all:", "--implementation", "cp"]
    command += ["--python-version", python_version, "--abi", f"cp{major}{minor}"]
    for platform in manylinux_platforms(glibc_version):
        command += ["--platform", platform]
    command += ["--requirement", str(requirements_file)]
    return command + ["--constraint", str(constraints_file)]


def make_wheelhouse(
    requirements: Path,
    dest: Path,
    *,
    python_version: str,
    glibc_version: str,
    log_path: Path | None = None,
) -> dict:
    """Download the wheels into ``dest`` (replaced whole) and return its manifest.

    ``dest`` then holds the wheels, ``requirements.txt`` (a copy of
    ``requirements``), ``constraints.txt`` and ``wheelhouse.json``.
    """
    with staged_directory(Path(dest)) as staging:
        shutil.copyfile(requirements, staging / "requirements.txt")
        constraints = staging / "constraints.txt"
        constraints.write_text("\n".join(constraints_from(installed_versions())) + "\n")
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
        if log_path is not None:
            Path(log_path).write_text(
                " ".join(command) + "\n" + finished.stdout + finished.stderr
            )
        if finished.returncode != 0:
            tail = "\n".join((finished.stdout + finished.stderr).splitlines()[-15:])
            raise WheelhouseFailed(
                f"pip download of {requirements} for CPython {python_version} "
                f"(glibc {glibc_version}) failed:\n{tail}"
            )
        wheels = sorted(staging.glob("*.whl"))
        refuse_cuda_wheels(wheels)
        manifest = {
            "requirements": requirements.read_text().splitlines(),
            "python_version": python_version,
            "glibc_version": glibc_version,
            "wheels": [
                {"file": wheel.name, "sha256": file_sha256(wheel), "bytes": size}
                for wheel in wheels
                for size in [wheel.stat().st_size]
            ],
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


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
