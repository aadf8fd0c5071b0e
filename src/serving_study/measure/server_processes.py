"""Which of a running server's processes are its main process and its scheduler.

A server is a tree of processes, sometimes below a container runtime's init, and
its control group may hold more. The monitors look at two of them: the main
HTTP/tokenizer process (the event loop under study) and SGLang's scheduler. They
are found once, when a measured window starts, and looked for again at its end: a
different answer means the server restarted during the window.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import psutil

SCHEDULER_TITLE_PREFIX = "sglang::scheduler"
MAIN_PROCESS_MARKERS = ("sglang.launch_server", "serving_study.engine")
THREAD_ENVIRONMENT_VARIABLES = (
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "MKL_NUM_THREADS",
    "GOMP_SPINCOUNT",
)


@dataclass
class ServerProcesses:
    """The processes of one server, as found at the start of a window."""

    main: psutil.Process
    scheduler: psutil.Process | None
    all_pids: set[int]


def command_line(process: psutil.Process) -> list[str]:
    """The process's arguments; empty once it is gone or hidden."""
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def find_server_processes(root_pid: int, group_pids: list[int]) -> ServerProcesses:
    """Find the main and scheduler processes among `root_pid`'s tree and a group.

    The scheduler is the process titled `sglang::scheduler…` (lowest title, so TP0).
    The main process is the scheduler's parent, else the process started with
    `sglang.launch_server` or `serving_study.engine`, else `root_pid` itself (for a
    container, `root_pid` is the runtime's init and the server sits below it).
    """
    root = psutil.Process(root_pid)
    tree = [root, *root.children(recursive=True)]
    candidates = {process.pid: process for process in tree}
    for pid in group_pids:
        if pid not in candidates:
            with contextlib.suppress(psutil.NoSuchProcess):
                candidates[pid] = psutil.Process(pid)
    command_lines = {pid: command_line(process) for pid, process in candidates.items()}

    titled = sorted(
        (arguments[0], pid)
        for pid, arguments in command_lines.items()
        if arguments and arguments[0].startswith(SCHEDULER_TITLE_PREFIX)
    )
    scheduler = candidates[titled[0][1]] if titled else None

    main = candidates.get(scheduler.ppid()) if scheduler is not None else None
    if main is None:
        marked = sorted(
            pid
            for pid, arguments in command_lines.items()
            if any(
                marker in part for part in arguments for marker in MAIN_PROCESS_MARKERS
            )
        )
        # The outermost marked process: a launcher may exec a child with the same args.
        outermost = [pid for pid in marked if candidates[pid].ppid() not in marked]
        main = candidates[outermost[0]] if outermost else root
    return ServerProcesses(main=main, scheduler=scheduler, all_pids=set(candidates))


def thread_environment(process: psutil.Process) -> dict[str, str | None]:
    """The variables that set the process's thread pools; empty when unreadable."""
    try:
        environment = process.environ()
    except (psutil.Error, OSError):
        return {}
    return {name: environment.get(name) for name in THREAD_ENVIRONMENT_VARIABLES}
