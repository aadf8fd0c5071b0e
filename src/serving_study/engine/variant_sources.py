"""Fetch the two SGLang source files the engine runs, from a release wheel.

The engine needs only `sglang/srt/managers/mm_utils.py` (the transport class)
and, from 0.5.16 on, `sglang/srt/utils/stale_shm_cleanup.py` (its segment
names). Both are read from the release's wheel at run time, never vendored.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from serving_study.engine.shm_loader import (
    MM_UTILS_RELATIVE_PATH,
    STALE_SHM_CLEANUP_RELATIVE_PATH,
)

WHEEL_PYTHON_VERSION = "3.11"
WHEEL_PLATFORM = "manylinux_2_34_x86_64"


def download_sglang_wheel(version: str, directory: Path) -> Path:
    """Download SGLang's wheel (no dependencies) with pip; return its path.

    A wheel already in the directory is reused.
    """
    directory.mkdir(parents=True, exist_ok=True)
    existing = sorted(directory.glob(f"sglang-{version}-*.whl"))
    if existing:
        return existing[0]
    # Only the Python sources are used, so any build of the release will do:
    # ask for one that exists whatever this host's Python and glibc are.
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        WHEEL_PYTHON_VERSION,
        "--platform",
        WHEEL_PLATFORM,
        "--dest",
        str(directory),
        f"sglang=={version}",
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    downloaded = sorted(directory.glob(f"sglang-{version}-*.whl"))
    if not downloaded:
        raise FileNotFoundError(
            f"pip download sglang=={version} left no wheel in {directory}"
        )
    return downloaded[0]


def extract_transport_sources(wheel: Path, destination: Path) -> Path:
    """Extract the transport's source files from the wheel into destination.

    Returns the directory to pass as `--sglang-source` (it holds `sglang/`).
    """
    with zipfile.ZipFile(wheel) as archive:
        members = set(archive.namelist())
        if MM_UTILS_RELATIVE_PATH.as_posix() not in members:
            raise FileNotFoundError(
                f"{wheel} has no {MM_UTILS_RELATIVE_PATH}: not an SGLang wheel?"
            )
        for relative_path in (MM_UTILS_RELATIVE_PATH, STALE_SHM_CLEANUP_RELATIVE_PATH):
            if relative_path.as_posix() in members:
                archive.extract(relative_path.as_posix(), destination)
    return destination
