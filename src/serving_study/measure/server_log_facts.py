"""What a real SGLang server's own processes say about themselves in its log.

SGLang has no endpoint that names the files it loaded or its main process's
intra-op threads, so the server runs with a load probe on its path
(``envs/server-probe/sitecustomize.py``): each process that imports the module
under study prints one ``serving-study loaded: {json}`` line with the file it
loaded, that file's sha256, its pid, its title and torch's intra-op thread
count at that moment. On CPU hosts the sgl-kernel stand-in prints a
``serving-study stand-in: <op> called in pid <pid> (<title>)`` line the first
time a process calls one of its ops. A process whose garbage collector was paused
for start-up prints ``serving-study gc resumed in pid <pid>`` when it turns it back
on. SGLang itself prints a warning once when an image went inline because
``/dev/shm`` was full. This module reads those lines;
the arm runner turns them into checks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

LOADED_PREFIX = "serving-study loaded: "
# A placeholder op (it raises) says so before its name; a real op does not.
STAND_IN_LINE = re.compile(
    r"serving-study stand-in: (?P<placeholder>placeholder )?(?P<op>\S+) "
    r"called in pid (?P<pid>\d+) \((?P<title>.*)\)"
)
GC_RESUMED_LINE = re.compile(r"serving-study gc resumed in pid (?P<pid>\d+)")
INLINE_FALLBACK_TEXT = "falling back to inline transport"
TRANSPORT_MODULE = "sglang.srt.managers.mm_utils"
# The variables the probe reports as the process sees them: its thread knobs, and
# those the runner names (/proc/<pid>/environ is overwritten by SGLang's process
# titles; launch/sglang.py names them): an arm's variables by value, its secrets
# as SECRET_SET or null.
REPORTED_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH_")
SECRET_SET = "<set>"
# How the main process's command line names the server it starts.
SERVER_COMMANDS = ("sglang.launch_server", "sglang serve")


@dataclass(frozen=True)
class LoadedModule:
    """One process's report of the transport module it imported."""

    module: str
    file: str
    sha256: str
    pid: int
    title: str
    torch_threads: int | None
    environment: dict[str, str | None]  # thread knobs and the variables asked about


@dataclass(frozen=True)
class StandInCall:
    op: str
    pid: int
    title: str
    placeholder: bool


def is_reported(name: str) -> bool:
    """The probe reports this variable unasked (envs/server-probe/sitecustomize.py)."""
    return name.startswith(REPORTED_PREFIXES)


def reported_values(
    reported: dict[str, str | None], expected: dict[str, str | None]
) -> dict[str, str | None]:
    """The values the probe saw of the ``expected`` variables it reports. A secret
    it saw set holds the runner's value: the runner passed it and nothing else can."""
    seen = {}
    for name, value in expected.items():
        if name not in reported and not is_reported(name):
            continue
        seen[name] = reported.get(name)
        if seen[name] == SECRET_SET:
            seen[name] = value
    return seen


def loaded_modules(log_text: str) -> list[LoadedModule]:
    """Every ``serving-study loaded:`` report in a server log, in order."""
    found = []
    for line in log_text.splitlines():
        _, marker, payload = line.partition(LOADED_PREFIX)
        if not marker:
            continue
        try:
            report = json.loads(payload)
            found.append(
                LoadedModule(
                    module=str(report["module"]),
                    file=str(report["file"]),
                    sha256=str(report["sha256"]),
                    pid=int(report["pid"]),
                    title=str(report.get("title", "")),
                    torch_threads=report.get("torch_threads"),
                    environment=dict(report.get("environment") or {}),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return found


def stand_in_calls(log_text: str) -> list[StandInCall]:
    """Every call of an sgl-kernel stand-in op the log reports."""
    matches = (STAND_IN_LINE.search(line) for line in log_text.splitlines())
    return [
        StandInCall(
            op=match["op"],
            pid=int(match["pid"]),
            title=match["title"],
            placeholder=bool(match["placeholder"]),
        )
        for match in matches
        if match
    ]


def gc_never_resumed(log_text: str, loads: list[LoadedModule]) -> list[int]:
    """Processes that loaded the module under study (``loads``, the log's
    ``loaded_modules``) but never resumed their garbage collector (meaningful only
    when the pause was asked for)."""
    loaders = {report.pid for report in loads if report.module == TRANSPORT_MODULE}
    resumed = {int(match["pid"]) for match in GC_RESUMED_LINE.finditer(log_text)}
    return sorted(loaders - resumed)


def inline_fallback_reported(log_text: str) -> bool:
    """SGLang warned that an image skipped shared memory (``/dev/shm`` full)."""
    return INLINE_FALLBACK_TEXT in log_text


def main_process_load(log_text: str, main_pid: int | None) -> LoadedModule | None:
    """The main process's load of the transport module.

    ``main_pid`` is the server's main process as this host sees it; inside a
    container the probe sees another pid namespace, so when no report carries
    that pid, the report of the process whose command line starts the server is
    taken (SGLang's children still have multiprocessing's spawn command line when
    they import the module; they take their ``sglang::`` titles later).
    """
    loads = loaded_modules(log_text)
    reports = [report for report in loads if report.module == TRANSPORT_MODULE]
    main = [report for report in reports if report.pid == main_pid]
    launchers = [
        report
        for report in reports
        if any(command in report.title for command in SERVER_COMMANDS)
    ]
    return next(iter(main + launchers), None)
