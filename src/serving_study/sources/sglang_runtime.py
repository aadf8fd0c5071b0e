"""Build the Python environment SGLang's real server runs in on a CPU-only host.

The environment is a venv installed from a closed lock
(``envs/sglang-cpu/requirements.lock``: every package pinned, so pip resolves
nothing). SGLang itself is not in it: each variant's source tree goes first on the
server's ``PYTHONPATH``, followed by the sgl-kernel stand-in that lives beside the
lock (``stand-in/``). The venv is built in ``venv.partial-<pid>`` and renamed to
``venv`` only once pip succeeded; its record (``venv/runtime.json``, copied to
``runtime.json`` beside it) is written last, so a half-built venv never counts. A
later call with the same lock (by sha256) reuses the venv as long as its Python
still runs and its files are as ``venv/files.json`` recorded them after the install
(a venv built before files were recorded has them recorded on its first reuse).

The venv is made from ``runtime_python.base_python()``; a venv made from another
base is rebuilt.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from serving_study.files import file_sha256, write_json
from serving_study.sources.hashed_lock import LockNotClosed, read_hashed_lock
from serving_study.sources.recorded_files import file_digests, require_unchanged
from serving_study.sources.runtime_python import (
    LOCK_PYTHON,
    SYSTEM_PYTHON,
    base_python,
    python_output,
)

RECORD = "runtime.json"
FILES_RECORD = "files.json"
VENV = "venv"
PARTIAL_PREFIX = "venv.partial-"
# The versions worth naming in the record; those the lock lacks are left out.
RECORDED_PACKAGES = tuple(
    "torch torchvision transformers tokenizers numpy pillow xgrammar".split()
)
PROGRESS_INTERVAL_S = 10.0
VERSIONS_SCRIPT = (
    "import json, sys\n"
    "from importlib.metadata import version\n"
    "print(json.dumps({'python_version': '%d.%d.%d' % sys.version_info[:3],\n"
    "    'packages': {name: version(name) for name in sys.argv[1:]}}))\n"
)


class RuntimeBuildError(RuntimeError):
    """The runtime could not be built or read; the message names what failed and
    the fix."""


def read_lock(lock_file: Path) -> dict[str, str]:
    """Canonical name -> version of every package of a closed, hashed lock; sglang
    itself must not be in it (the variant's tree provides it)."""
    try:
        packages = read_hashed_lock(Path(lock_file).read_text(), str(lock_file))
    except LockNotClosed as error:
        raise RuntimeBuildError(str(error)) from None
    if "sglang" in packages:
        raise RuntimeBuildError(
            f"{lock_file}: sglang is pinned in the lock; remove it (the variant's"
            " source tree on PYTHONPATH provides sglang)"
        )
    return {name: package.version for name, package in packages.items()}


def runtime_record(dest: Path) -> dict:
    """The record of the runtime built at ``dest`` (``dest/runtime.json``)."""
    path = Path(dest) / RECORD
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise RuntimeBuildError(
            f"{path} does not exist: build the runtime first"
            " (snakemake resources/sglang-runtime/runtime.json)"
        ) from None
    except ValueError as error:
        raise RuntimeBuildError(
            f"{path} is not valid JSON ({error}); delete it and build again"
        ) from None


def ensure_sglang_runtime(
    lock_file: Path,
    dest: Path,
    progress: Callable[[str], None] = print,
    base: Path | None = None,
) -> dict:
    """Build (or reuse) the venv at ``dest/venv`` from ``lock_file``, made from
    ``base`` (``base_python()`` when not given); return its record, written to
    ``dest/runtime.json``.

    ``progress`` receives a status line every ~10 s while pip runs and each line
    pip prints.
    """
    base = base_python() if base is None else Path(base)
    lock_file = Path(lock_file).resolve()
    dest = Path(dest).resolve()
    pins = read_lock(lock_file)
    lock_sha256 = file_sha256(lock_file)
    stand_in = lock_file.parent / "stand-in"
    if not (stand_in / "sgl_kernel" / "__init__.py").is_file():
        raise RuntimeBuildError(
            f"{stand_in}/sgl_kernel/__init__.py is missing: the sgl-kernel stand-in"
            " must sit beside the lock"
        )
    _remove_dead_partials(dest)
    record = _reusable_record(dest, lock_sha256, base)
    if record is not None:
        _require_files_as_recorded(dest / VENV, progress)
        progress(f"reusing {dest / VENV} (lock sha256 {lock_sha256[:12]})")
    else:
        record = _build(lock_file, lock_sha256, pins, stand_in, dest, base, progress)
    # A copy of the venv's own record: Snakemake deletes a job's output before it
    # runs, and a rerun with the same lock must still find the venv reusable.
    _write_json_atomically(dest / RECORD, record)
    return record


def _build(
    lock_file: Path,
    lock_sha256: str,
    pins: dict[str, str],
    stand_in: Path,
    dest: Path,
    base: Path,
    progress: Callable[[str], None],
) -> dict:
    """Install the lock into a fresh ``dest/venv`` made from ``base`` and return
    its record."""
    if base == Path(sys.executable) and sys.version_info[:2] != LOCK_PYTHON:
        wanted = "{}.{}".format(*LOCK_PYTHON)
        running = "{}.{}".format(*sys.version_info[:2])
        raise RuntimeBuildError(
            f"the lock holds wheels for Python {wanted} but {sys.executable} is"
            f" Python {running}; run the workflow with Python {wanted}"
            f" (envs/workflow.yaml), or install the system's {SYSTEM_PYTHON}"
            " with venv (Debian: apt-get install python3-venv)"
        )
    progress(f"making the venv from {base}")
    dest.mkdir(parents=True, exist_ok=True)
    # The records go first: from here on nothing at dest counts as built.
    (dest / RECORD).unlink(missing_ok=True)
    shutil.rmtree(dest / VENV, ignore_errors=True)
    venv = dest / VENV
    partial = dest / f"{PARTIAL_PREFIX}{os.getpid()}"
    try:
        _run_checked(
            [str(base), "-m", "venv", "--prompt", "sglang-runtime", str(partial)],
            "creating the venv",
            "make sure this Python has the venv and ensurepip modules"
            " (Debian: apt-get install python3-venv)",
        )
        _install_lock(partial / "bin" / "python", lock_file, partial, progress)
        os.rename(partial, venv)
    finally:
        if partial.exists():
            shutil.rmtree(partial)
    _repoint_venv(venv, partial)

    python = venv / "bin" / "python"
    installed = _installed_versions(python, [n for n in RECORDED_PACKAGES if n in pins])
    if installed is None:
        raise RuntimeBuildError(
            f"{python} does not run after a complete install; delete {dest} and"
            " build again"
        )
    record = {
        "lock_file": str(lock_file),
        "lock_sha256": lock_sha256,
        "python": str(python),
        "base_python": str(base),
        "python_version": installed["python_version"],
        "packages": installed["packages"],
        "stand_in": str(stand_in),
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    _write_json_atomically(venv / FILES_RECORD, _venv_files(venv))
    _write_json_atomically(venv / RECORD, record)
    progress(f"built {venv}: {len(pins)} packages, {_tree_bytes(venv) / 1e9:.2f} GB")
    return record


def _reusable_record(dest: Path, lock_sha256: str, base: Path) -> dict | None:
    """The venv's own record, when it was built from this very lock at this place
    from ``base``, and its Python still runs."""
    try:
        record = runtime_record(dest / VENV)
    except RuntimeBuildError:
        return None
    python = dest / VENV / "bin" / "python"
    reusable = (
        record.get("lock_sha256") == lock_sha256
        and record.get("python") == str(python)
        and record.get("base_python") == str(base)
        and _installed_versions(python, []) is not None
    )
    return record if reusable else None


def _require_files_as_recorded(venv: Path, progress: Callable[[str], None]) -> None:
    """Raise RecordedFileChanged naming a file of ``venv`` that is not as recorded
    after its install; record them if the venv predates such records."""
    recorded = venv / FILES_RECORD
    found = _venv_files(venv)
    if not recorded.is_file():
        progress(f"{venv} predates its record of files: recording {len(found)} now")
        _write_json_atomically(recorded, found)
        return
    require_unchanged(
        venv, json.loads(recorded.read_text()), found, again="build it again"
    )


def _venv_files(venv: Path) -> dict[str, str]:
    """The sha256 of every file of the venv but its records (bytecode left out)."""
    return file_digests(venv, leave_out=(RECORD, FILES_RECORD))


def _write_json_atomically(path: Path, value: dict) -> None:
    staged = path.with_name(f"{path.name}.partial-{os.getpid()}")
    write_json(staged, value)
    os.replace(staged, path)


def _remove_dead_partials(dest: Path) -> None:
    """Remove what builds that died left (a live builder's partial venv stays)."""
    for partial in dest.glob(f"{PARTIAL_PREFIX}*"):
        pid = partial.name.removeprefix(PARTIAL_PREFIX)
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue
        shutil.rmtree(partial, ignore_errors=True)
    for record in dest.glob(f"{RECORD}.partial-*"):
        record.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _install_lock(
    python: Path, lock_file: Path, venv: Path, progress: Callable[[str], None]
) -> None:
    """pip-install exactly the lock into ``venv``, passing pip's output and a
    periodic status line to ``progress``."""
    argv = [str(python), "-m", "pip", "install", "--require-virtualenv", "--no-deps"]
    argv += ["--require-hashes", "--only-binary=:all:", "--no-input"]
    argv += ["--disable-pip-version-check", "--progress-bar", "off"]
    # No bytecode now: compiling all ~16,000 files took about a minute on 2 cores,
    # and a server compiles (and keeps) only the fraction it imports.
    argv += ["--no-compile", "--requirement", str(lock_file)]
    progress("$ " + " ".join(argv))
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_forward_lines, args=(process, lines), daemon=True).start()
    tail: deque[str] = deque(maxlen=40)
    next_status = started + PROGRESS_INTERVAL_S
    while True:
        try:
            line = lines.get(timeout=max(0.0, next_status - time.monotonic()))
        except queue.Empty:
            line = ""
        if line is None:
            break
        if line:
            tail.append(line)
            progress(f"pip: {line}")
        if time.monotonic() >= next_status:
            progress(
                f"installing: {time.monotonic() - started:.0f} s,"
                f" venv {_tree_bytes(venv) / 1e9:.2f} GB so far"
            )
            next_status += PROGRESS_INTERVAL_S
    if process.wait() != 0:
        errors = [line for line in tail if "ERROR" in line] or list(tail)[-5:]
        raise RuntimeBuildError(
            f"pip exited with {process.returncode} installing {lock_file}:\n  "
            + "\n  ".join(errors)
            + "\nEach line of the lock must exist as a wheel for this Python and"
            " platform on the configured index (pip config list); fix the package"
            " named above in the lock (or the index), then build again."
            f"\nCommand: {' '.join(argv)}"
        )


def _forward_lines(process: subprocess.Popen, lines: queue.Queue) -> None:
    for line in process.stdout:
        lines.put(line.rstrip())
    lines.put(None)


def _run_checked(argv: list[str], what: str, fix: str) -> None:
    finished = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if finished.returncode != 0:
        raise RuntimeBuildError(
            f"{what} failed (exit {finished.returncode}): {' '.join(argv)}\n"
            f"{finished.stderr.strip() or finished.stdout.strip()}\nFix: {fix}"
        )


def _repoint_venv(venv: Path, built_at: Path) -> None:
    """A venv's scripts and pyvenv.cfg name the directory it was built in
    (shebangs, activate); point them at the directory it was renamed to."""
    old, new = str(built_at).encode(), str(venv).encode()
    for file in [*(venv / "bin").iterdir(), venv / "pyvenv.cfg"]:
        if file.is_symlink() or not file.is_file():
            continue
        content = file.read_bytes()
        if old in content:
            file.write_bytes(content.replace(old, new))


def _installed_versions(python: Path, packages: list[str]) -> dict | None:
    """The venv's Python version and the installed versions of ``packages``, or
    None when that Python does not run."""
    output = python_output(python, VERSIONS_SCRIPT, *packages, timeout=120)
    return None if output is None else json.loads(output)


def _tree_bytes(root: Path) -> int:
    """Bytes of every file under ``root`` (links not followed; files that vanish
    while pip works are skipped)."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total
