"""Install what SGLang's server lacks beside a GPU host's own Python and torch.

On a GPU host whose torch is not SGLang's pin (``sglang.torch: host``, see
``config/platform.py``), the server runs with the host's own Python and torch, and
the CPU-side packages it lacks come from a closed lock of wheels for that Python
(``envs/sglang-gpu-host/requirements.lock``). They are installed into
``dest/site``, a folder the server's ``PYTHONPATH`` names after the variant's tree
and the stand-ins, so nothing of the host's own installation changes. The lock's
wheels are kept in ``dest/wheels``: downloaded there once (the only step that needs
a package index), or put there beforehand on a host without one
(``docs/gpu-hosts.md``). pip installs them with ``--require-hashes``, so a wheel
whose sha256 differs from the lock's stops the build.

The record (``dest/runtime.json``, written last) names the host's Python and its
torch beside the torch SGLang pins: that difference is what the report names. A
later call with the same lock (by sha256) and Python reuses the folder once every
file is found as ``dest/files.json`` recorded it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from serving_study.files import file_sha256, write_json
from serving_study.sources.hashed_lock import canonical_name
from serving_study.sources.recorded_files import file_digests, require_unchanged
from serving_study.sources.runtime_python import python_output
from serving_study.sources.sglang_runtime import RuntimeBuildError, read_lock

RECORD = "runtime.json"
FILES_RECORD = "files.json"
SITE = "site"
WHEELS = "wheels"
# The host's own packages the server runs with, named in the record.
HOST_PACKAGES = ("torch", "torchvision", "triton", "numpy", "tokenizers")
# Where SGLang's own pins are written down (the lock of its pinned stack on CPU).
SGLANG_PINS_LOCK = Path(__file__).resolve().parents[3] / (
    "envs/sglang-cpu/requirements.lock"
)
VERSIONS_SCRIPT = (
    "import json, sys\n"
    "from importlib.metadata import PackageNotFoundError, version\n"
    "def found(name):\n"
    "    try:\n"
    "        return version(name)\n"
    "    except PackageNotFoundError:\n"
    "        return None\n"
    "print(json.dumps({'python_version': '%d.%d.%d' % sys.version_info[:3],\n"
    "    'packages': {name: found(name) for name in sys.argv[1:]}}))\n"
)


def ensure_host_torch_runtime(
    lock_file: Path,
    dest: Path,
    python: Path | None = None,
    progress: Callable[[str], None] = print,
) -> dict:
    """Install (or reuse) the lock's packages in ``dest/site`` for ``python`` (the
    Python running this when not given) and return the record, written to
    ``dest/runtime.json``."""
    python = Path(python or sys.executable)
    lock_file, dest = Path(lock_file).resolve(), Path(dest).resolve()
    pins = read_lock(lock_file)
    lock_sha256 = file_sha256(lock_file)
    record = _reusable_record(dest, lock_sha256, python)
    if record is not None:
        require_unchanged(
            dest / SITE,
            json.loads((dest / FILES_RECORD).read_text()),
            file_digests(dest / SITE),
            again="install it again",
        )
        progress(f"reusing {dest / SITE} (lock sha256 {lock_sha256[:12]})")
        return record
    (dest / RECORD).unlink(missing_ok=True)
    wheels = dest / WHEELS
    missing = missing_wheels(wheels, pins)
    if missing:
        progress(
            f"downloading {len(missing)} wheels into {wheels}: {', '.join(missing)}"
        )
        _pip(python, "download", lock_file, ["--dest", str(wheels)], progress)
    install_site(python, lock_file, wheels, dest / SITE, progress)
    record = _record(python, lock_file, lock_sha256, dest / SITE)
    write_json(dest / FILES_RECORD, file_digests(dest / SITE))
    write_json(dest / RECORD, record)
    progress(
        f"installed {len(pins)} packages into {dest / SITE} beside {python} "
        f"(torch {record['packages'].get('torch')})"
    )
    return record


def missing_wheels(wheels: Path, pins: dict[str, str]) -> list[str]:
    """``name==version`` of each pin no wheel in ``wheels`` has (by its file name;
    pip checks every wheel's sha256 when it installs)."""
    found = set()
    for wheel in Path(wheels).glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        found.add((canonical_name(name), version))
    return [
        f"{name}=={version}"
        for name, version in sorted(pins.items())
        if (name, version) not in found
    ]


def _reusable_record(dest: Path, lock_sha256: str, python: Path) -> dict | None:
    try:
        record = json.loads((dest / RECORD).read_text())
    except (FileNotFoundError, ValueError):
        return None
    reusable = (
        record.get("lock_sha256") == lock_sha256
        and record.get("python") == str(python)
        and (dest / FILES_RECORD).is_file()
    )
    return record if reusable else None


def install_site(
    python: Path,
    lock_file: Path,
    wheels: Path,
    site: Path,
    progress: Callable[[str], None],
) -> None:
    """pip-install exactly the lock from ``wheels`` (no index) into ``site``, built
    beside it and renamed into place, then compile its bytecode once: each of the
    server's processes imports much of it at every start."""
    partial = site.with_name(f"{site.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    options = ["--no-index", "--find-links", str(wheels), "--target", str(partial)]
    try:
        _pip(python, "install", lock_file, options, progress)
        compiled = subprocess.run(
            [str(python), "-m", "compileall", "-q", "-j", "0", str(partial)],
            capture_output=True,
            text=True,
            check=False,
        )
        if compiled.returncode != 0:
            progress(
                f"compileall: some files did not compile: {compiled.stdout[-500:]}"
            )
        shutil.rmtree(site, ignore_errors=True)
        os.rename(partial, site)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _pip(
    python: Path,
    command: str,
    lock_file: Path,
    options: list[str],
    progress: Callable[[str], None],
) -> None:
    argv = [str(python), "-m", "pip", command, "--no-deps", "--require-hashes"]
    argv += ["--only-binary=:all:", "--no-input", "--disable-pip-version-check"]
    argv += ["--progress-bar", "off", *options, "--requirement", str(lock_file)]
    progress("$ " + " ".join(argv))
    finished = subprocess.run(argv, capture_output=True, text=True, check=False)
    if finished.returncode != 0:
        errors = [line for line in finished.stderr.splitlines() if "ERROR" in line]
        raise RuntimeBuildError(
            f"pip {command} exited with {finished.returncode} for {lock_file}:\n  "
            + "\n  ".join(errors or finished.stderr.splitlines()[-5:])
            + f"\nThe lock holds wheels for CPython 3.12 on Linux x86-64; {python} "
            "must be such a Python. On a host without a package index, put the "
            "lock's wheels in the runtime's wheels/ folder first (docs/gpu-hosts.md)."
        )


def _record(python: Path, lock_file: Path, lock_sha256: str, site: Path) -> dict:
    """What the server runs with: the host's Python and packages, the lock's beside
    them, and the torch SGLang pins, which this runtime does not have."""
    output = python_output(python, VERSIONS_SCRIPT, *HOST_PACKAGES, timeout=300)
    if output is None:
        raise RuntimeBuildError(f"{python} does not run")
    host = json.loads(output)
    sglang_pins = read_lock(SGLANG_PINS_LOCK)
    return {
        "kind": "host-torch",
        "lock_file": str(lock_file),
        "lock_sha256": lock_sha256,
        "python": str(python),
        "python_version": host["python_version"],
        "site": str(site),
        "packages": host["packages"],
        "installed": read_lock(lock_file),
        "sglang_pins": {name: sglang_pins.get(name) for name in HOST_PACKAGES},
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
