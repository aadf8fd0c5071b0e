"""Starting a server process tree on this host inside its own CPU-quota cgroup.

The server is started through ``serving_study.servers.cgroup_exec``, which joins the
cgroup before exec, so every thread and child (scheduler, resource tracker) is born
inside the quota, and it is killed if the runner dies (``parent_death``). The client and
the monitors stay in the caller's cgroup. Teardown is one ``stop()`` that always leaves
nothing behind: the process group is terminated, then everything still in the cgroup is
killed, the cgroup removed, and any shared-memory segment the server's processes created
is unlinked and reported (what SGLang's stop leaves by design is removed, not reported:
``shared_memory``).

With ``quota_scope="main_process"`` the quota binds the main process alone: once
the server is up, its model processes (titled ``sglang::...``: scheduler,
detokenizer) and their children move to a second group without a quota. That
models a host whose model runs elsewhere (on a GPU), where the main process's own
CPU is what the quota starves.
"""

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

from serving_study.launch.plan import LaunchPlan
from serving_study.servers.cgroups import CpuQuotaGroup, wrap_command
from serving_study.servers.owners import owner_of
from serving_study.servers.parent_death import killed_with_parent
from serving_study.servers.shared_memory import (
    SGLANG_SEGMENT_PREFIX,
    SHARED_MEMORY,
    forget_owned,
    record_owned,
    remove_unheld,
    segment_creator,
    shutdown_leftovers,
)

log = logging.getLogger(__name__)

MODEL_PROCESS_TITLE_PREFIX = "sglang::"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the server may still lose a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def log_tail(log_path: Path, lines: int = 30) -> str:
    """The last lines of a server's log (empty when there is none yet)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def model_processes(pids: list[int]) -> list[int]:
    """Of ``pids``, the processes titled ``sglang::...`` and all their children."""
    found: set[int] = set()
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(pid)
            if process.name().startswith(MODEL_PROCESS_TITLE_PREFIX):
                found.add(pid)
                found.update(child.pid for child in process.children(recursive=True))
    return sorted(found)


def segments_created_by(pids: set[int]) -> list[Path]:
    """SGLang shared-memory segments whose creator pid is one of ``pids``."""
    segments = SHARED_MEMORY.glob(f"{SGLANG_SEGMENT_PREFIX}*")
    return [path for path in segments if segment_creator(path.name) in pids]


class LocalServer:
    """One plan's server process tree in a fresh cgroup with the plan's quota."""

    def __init__(self, plan: LaunchPlan, group_name: str, log_path: Path):
        self.plan = plan
        self.quota_cores = plan.quota.cores
        self.group_name = group_name
        self.log_path = log_path
        self.environment = plan.environment_from(os.environ)
        self.model_group: CpuQuotaGroup | None = None
        self.moved_model_pids: list[int] = []
        self.group: CpuQuotaGroup | None = None
        self.process: subprocess.Popen | None = None
        self.known_pids: set[int] = set()
        self.leaked_segments: list[str] = []
        self.shutdown_files_before: set[Path] = set()
        # What was exec'd: the plan's command behind the cgroup's joining helper.
        self.runtime_argv: list[str] | None = None

    def start(self) -> None:
        self.shutdown_files_before = shutdown_leftovers()
        self.group = CpuQuotaGroup.create(
            self.group_name, self.quota_cores if self.plan.quota.from_start else None
        )
        self.runtime_argv = wrap_command(self.group, self.plan.command())
        with open(self.log_path, "ab") as server_log:
            self.process = subprocess.Popen(
                self.runtime_argv,
                env=self.environment,
                cwd=self.plan.working_directory,
                stdin=subprocess.DEVNULL,
                stdout=server_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # A runner killed outright takes its server with it.
                preexec_fn=killed_with_parent,
            )
        self.known_pids.add(self.process.pid)
        self.remember_tree()
        log.info(
            "server pid %d started in cgroup %s (quota %s cores)",
            self.process.pid,
            self.group_name,
            "none" if self.quota_cores is None else f"{self.quota_cores:g}",
        )

    def apply_quota(self) -> None:
        """Put the arm's quota in force (when start-up ran without it)."""
        self.group.set_quota(self.quota_cores)
        log.info("quota of %s cores in force", self.quota_cores)

    def settle_after_start(self) -> None:
        """Once healthy: with the main-process scope, move the model processes out
        of the quota's group (see the module's docstring)."""
        if not self.plan.quota.main_process_only:
            return
        self.model_group = CpuQuotaGroup.create(f"{self.group_name}-model", None)
        moved = model_processes(self.group.pids())
        if not moved:
            raise RuntimeError(
                "quota_scope main_process: the server has no sglang::* model "
                "processes to move out of the quota (is this a real SGLang server?)"
            )
        for pid in moved:
            self.model_group.adopt(pid)
        self.moved_model_pids = moved
        log.info(
            "model processes %s moved out of the quota into %s",
            moved,
            self.model_group.cpu_directory,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def remember_tree(self) -> None:
        """Note every pid of the tree, so their segments can be found after death."""
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.process.pid)
            self.known_pids.update(child.pid for child in root.children(recursive=True))
        for group in (self.group, self.model_group):
            if group is not None:
                self.known_pids.update(group.pids())
        made = shutdown_leftovers() - self.shutdown_files_before
        record_owned(self.group_name, owner_of(self.group_name), self.known_pids, made)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, grace_s: float = 10.0) -> None:
        """Terminate the tree, empty and remove the cgroup, unlink leaked segments.

        The quota is lifted first: a stop is not measured, and under a 0.15-core
        quota SGLang's main process took 6.8 s to exit, 3 s without it."""
        try:
            if self.process is not None:
                self.remember_tree()
                self._lift_quota()
                self._terminate_process_group(grace_s)
        finally:
            try:
                for group in (self.group, self.model_group):
                    if group is not None:
                        self.known_pids.update(group.pids())
                        group.remove()
            finally:
                self._unlink_leaked_segments()
                forget_owned(self.group_name)

    def _lift_quota(self) -> None:
        try:
            self.group.set_quota(None)
        except OSError as error:  # the group is gone: nothing left to throttle
            log.debug("quota not lifted before the stop: %s", error)

    def _terminate_process_group(self, grace_s: float) -> None:
        if self.process.poll() is None:
            stop_signal = signal.Signals[self.plan.stop_signal]
            with contextlib.suppress(ProcessLookupError):
                if self.plan.stop_leader_only:
                    self.process.send_signal(stop_signal)
                else:
                    os.killpg(self.process.pid, stop_signal)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("server did not stop in %.0f s; killing it", grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        # The scheduler notices its parent's death within a poll interval; give the
        # group a moment before the cgroup removal kills what is left.
        deadline = time.monotonic() + 2.0
        groups = [group for group in (self.group, self.model_group) if group]
        while any(group.pids() for group in groups) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _unlink_leaked_segments(self) -> None:
        for segment in segments_created_by(self.known_pids):
            self.leaked_segments.append(segment.name)
            segment.unlink(missing_ok=True)
        # SGLang's stop leaves these by design: removed, not counted as leaks.
        remove_unheld(shutdown_leftovers() - self.shutdown_files_before)
        if self.leaked_segments:
            log.warning(
                "removed %d shared-memory segments the server left behind",
                len(self.leaked_segments),
            )

    def __enter__(self) -> "LocalServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
