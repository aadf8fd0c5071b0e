"""Probe: each process that imports SGLang's ``mm_utils`` says which file it ran.

Python imports ``sitecustomize`` from ``sys.path`` at start-up, so this file on the
server's ``PYTHONPATH`` runs in the main process and in every process SGLang spawns.
A ``sys.meta_path`` finder lets the real finders locate the module, then wraps that
spec's loader so that, once the module has executed, one line goes to stderr::

    serving-study loaded: {"module": ..., "file": ..., "sha256": ..., "pid": ...,
                           "title": ..., "torch_threads": ..., "environment": ...}

Nothing else is changed: other modules are not touched, and torch is read from
``sys.modules`` (never imported here). The one exception is asked for by the
runner and undone before the server is healthy: Python's garbage collector is
paused during start-up (``serving_study_startup_gc``).
"""

import hashlib
import json
import os
import re
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from itertools import pairwise
from types import ModuleType

import serving_study_startup_gc

PROBED_MODULE = "sglang.srt.managers.mm_utils"
# More modules to report, comma-separated: the runner names those a variant's
# patch changes, so that a patch to a file the server never loads is caught.
EXTRA_MODULES_VARIABLE = "SERVING_STUDY_REPORT_MODULES"
PROBED_MODULES = frozenset(
    [PROBED_MODULE]
    + [name for name in os.environ.get(EXTRA_MODULES_VARIABLE, "").split(",") if name]
)
# The thread knobs this process runs with, as it sees them: /proc/<pid>/environ is
# no witness once a process has imported setproctitle, which reuses that memory.
THREAD_KNOB_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH_")
# The config check's rule for a secret's name (serving_study/config/secrets.py; this
# probe runs where the package may not be, and a test keeps the two the same).
SECRET_WORDS = frozenset(
    {
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "PASSPHRASE",
        "CREDENTIAL",
        "CREDENTIALS",
        "APIKEY",
    }
)
SECRET_WORD_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY")})
# For the same reason the runner names, comma-separated, the other variables an arm
# sets (reported with their values, null when unset) and the secrets it passes
# (reported as SECRET_SET when set, never by value).
REPORT_VARIABLES_VARIABLE = "SERVING_STUDY_REPORT_VARIABLES"
REPORT_PRESENCE_VARIABLE = "SERVING_STUDY_REPORT_PRESENCE"
SECRET_SET = "<set>"


def _process_title() -> str:
    """This process's title now: SGLang names its children (``sglang::scheduler``)
    only after they imported mm_utils, so there it is still the spawn command line;
    the pid tells the processes apart."""
    setproctitle = sys.modules.get("setproctitle")
    if setproctitle is not None:
        title = setproctitle.getproctitle()
    else:
        with open("/proc/self/cmdline", "rb") as cmdline:
            title = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    return " ".join(title.split())  # one line, even for ``python -c`` scripts


def is_secret(name: str) -> bool:
    words = [word for word in re.split(r"[^A-Z0-9]+", name.upper()) if word]
    return any(word in SECRET_WORDS for word in words) or any(
        pair in SECRET_WORD_PAIRS for pair in pairwise(words)
    )


def _named_in(variable: str) -> list[str]:
    return [name for name in os.environ.get(variable, "").split(",") if name]


def _reported_environment() -> dict:
    """The thread knobs set here, and the variables the runner asked about."""
    reported = {
        name: value
        for name, value in sorted(os.environ.items())
        if name.startswith(THREAD_KNOB_PREFIXES) and not is_secret(name)
    }
    with_values = _named_in(REPORT_VARIABLES_VARIABLE)
    for name in with_values:
        if not is_secret(name):
            reported[name] = os.environ.get(name)
    for name in _named_in(REPORT_PRESENCE_VARIABLE) + with_values:
        if name not in reported:
            reported[name] = SECRET_SET if name in os.environ else None
    return reported


def _report(module: ModuleType) -> None:
    path = os.path.abspath(module.__file__)
    with open(path, "rb") as source:
        digest = hashlib.sha256(source.read()).hexdigest()
    torch = sys.modules.get("torch")
    record = {
        "module": module.__name__,
        "file": path,
        "sha256": digest,
        "pid": os.getpid(),
        "title": _process_title(),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "environment": _reported_environment(),
    }
    print(f"serving-study loaded: {json.dumps(record)}", file=sys.stderr, flush=True)


class MmUtilsProbe:
    """Meta-path finder that only reports; the real finders still find the module."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname not in PROBED_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real_exec_module = spec.loader.exec_module

        def exec_module_then_report(module: ModuleType) -> None:
            real_exec_module(module)
            _report(module)

        # An instance attribute: only this module's loader object is wrapped.
        spec.loader.exec_module = exec_module_then_report
        return spec


sys.meta_path.insert(0, MmUtilsProbe())
serving_study_startup_gc.pause_until_first_freeze()
