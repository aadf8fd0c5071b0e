"""Which Python the CPU runtime's venv is made from.

The operating system's own Python of the lock's version (``/usr/bin/python3.11``)
when the host has one with ``venv``, else the Python running the workflow.
Distributions build theirs with profile-guided and link-time optimization, as the
CPU image's Debian Python is; a Python built from source (pyenv's, by default) is
not. A fresh server's start is mostly its three processes importing SGLang, torch
and transformers, and Debian's build started servers faster than a pyenv build on
our 2-core host.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# The lock holds cp311 wheels (torch's among them).
LOCK_PYTHON = (3, 11)
SYSTEM_PYTHON = Path("/usr/bin/python{}.{}".format(*LOCK_PYTHON))
BASE_CHECK_SCRIPT = "import ensurepip, sys, venv; print('%d.%d' % sys.version_info[:2])"


def python_output(
    python: Path, script: str, *arguments: str, timeout: float
) -> str | None:
    """What ``python -c script arguments`` prints, or None when it fails to run."""
    try:
        finished = subprocess.run(
            [str(python), "-c", script, *arguments],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return finished.stdout if finished.returncode == 0 else None


def base_python(system_python: Path = SYSTEM_PYTHON) -> Path:
    """The Python the venv is made from: ``system_python`` when it runs, is the
    lock's version and has ``venv``; else the Python running this."""
    found = python_output(system_python, BASE_CHECK_SCRIPT, timeout=60)
    if found is not None and found.strip() == "{}.{}".format(*LOCK_PYTHON):
        return system_python
    return Path(sys.executable)
