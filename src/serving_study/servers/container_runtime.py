"""Starting a server in a container (docker or podman) with the arm's CPU quota.

``ContainerServer`` has the interface of ``local_runtime.LocalServer``, so the arm
runner treats both alike. It starts the container with the command line of
``container_commands`` and watches it from the host: the container's processes are
host processes, found from its init pid, and its cgroup is read where the runtime
made it, so the monitors stay outside.

Teardown is one ``stop()`` that leaves nothing behind: the container's quota is
lifted (a stop is not measured, and under a small quota it only takes longer), it is
stopped (its stop signal, SIGKILL after a grace period), the shared-memory segments
its processes left are listed and removed, and the container is removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
from pathlib import Path

import psutil

from serving_study.launch.plan import LaunchPlan
from serving_study.servers import container_watchdog
from serving_study.servers.cgroup_hierarchy import QuotaUnavailable
from serving_study.servers.container_commands import (
    QUOTA_INSIDE_SCRIPT,
    ContainerCommandFailed,
    container_name,
    parse_quota,
    run_command,
)
from serving_study.servers.cpu_group import CpuGroup, group_of_pid
from serving_study.servers.local_runtime import log_tail
from serving_study.servers.owners import owner_of
from serving_study.servers.shared_memory import (
    SGLANG_SEGMENT_PREFIX,
    SHARED_MEMORY,
    forget_owned,
    namespace_pid,
    record_owned,
    remove_unheld,
    segment_creator,
    shutdown_leftovers,
)
from serving_study.sources.images import normal_image_id

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 300


class _ContainerProcess:
    """What ``client.wait_until_healthy`` asks of a server process: ``poll()``."""

    def __init__(self, server: ContainerServer):
        self._server = server
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = self._server.exit_code()
        return self.returncode


class ContainerServer:
    """One plan's server in a fresh container (see module docstring);
    ``runtime_argv`` is the runtime command that starts it."""

    def __init__(self, plan: LaunchPlan, group_name: str, log_path: Path):
        self.plan = plan
        self.environment = dict(plan.environment)
        self.quota_cores = plan.quota.cores
        self.group_name = group_name
        self.log_path = Path(log_path)
        self.runtime = plan.container.runtime
        self.image = plan.container.image
        self.name = container_name(group_name)
        self.ipc_host = plan.container.ipc_host
        self.shutdown_files_before: set[Path] = set()
        self.runtime_argv = run_command(plan, self.name, label=group_name)
        self.container_id: str | None = None
        # The image the runtime says the container runs (its id), once started.
        self.image_run: str | None = None
        self.group: CpuGroup | None = None
        self.process = _ContainerProcess(self)
        self.known_pids: set[int] = set()
        self.namespace_pids: set[int] = set()
        self.leaked_segments: list[str] = []
        self._init_pid: int | None = None
        self._exit_code: int | None = None
        self._log_follower: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None

    # -- runtime commands

    def _runtime(self, *arguments: str, timeout: float = COMMAND_TIMEOUT_S):
        return subprocess.run(
            [self.runtime, *arguments],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def _inspect(self, template: str) -> str:
        """``inspect --format template`` of the container ("" once it is gone)."""
        finished = self._runtime("inspect", "--format", template, self.container_id)
        return finished.stdout if finished.returncode == 0 else ""

    def _state(self) -> dict | None:
        """The container's ``State`` record, None once it is gone."""
        state = self._inspect("{{json .State}}")
        return json.loads(state) if state else None

    # -- the interface of LocalServer

    def start(self) -> None:
        """Start the container; a refused start shows as an exit code and in the log."""
        if self.ipc_host:
            self.shutdown_files_before = shutdown_leftovers()
        for host_path, _ in self.plan.container.writable_mounts:
            Path(host_path).mkdir(parents=True, exist_ok=True)
        finished = self._runtime(*self.runtime_argv[1:])
        if finished.returncode != 0:
            self._exit_code = finished.returncode or 1
            with open(self.log_path, "a") as server_log:
                server_log.write(
                    f"`{self.runtime} run` failed with code {finished.returncode}: "
                    f"{finished.stderr.strip()}\n"
                )
            log.error("%s run failed: %s", self.runtime, finished.stderr.strip())
            return
        self.container_id = finished.stdout.strip().splitlines()[-1]
        try:
            # Removes the container should this runner be killed outright.
            self._watchdog = container_watchdog.watch(
                self.runtime, self.container_id, self.log_path
            )
            self._watch_started_container()
        except BaseException:
            self.stop()  # started, never handed over: leave nothing behind
            raise

    def _watch_started_container(self) -> None:
        with open(self.log_path, "ab") as server_log:
            # Follows the logs until the container stops, so it also tells (cheaply)
            # whether the container still runs.
            self._log_follower = subprocess.Popen(
                [self.runtime, "logs", "--follow", self.container_id],
                stdin=subprocess.DEVNULL,
                stdout=server_log,
                stderr=subprocess.STDOUT,
            )
        self.image_run = normal_image_id(self._inspect("{{.Image}}"))
        state = self._state() or {}
        if state.get("Pid"):
            self._init_pid = state["Pid"]
            self.known_pids.add(self._init_pid)
            try:
                self.group = group_of_pid(self._init_pid)
            except QuotaUnavailable:
                # Exited already: exit_code() tells, and there is nothing to read.
                if psutil.pid_exists(self._init_pid):
                    raise
        log.info(
            "container %s (%s) started, init pid %s, quota %s cores%s",
            self.name,
            self.container_id[:12],
            self._init_pid,
            "none" if self.quota_cores is None else f"{self.quota_cores:g}",
            "" if self.plan.quota.from_start else " once healthy",
        )

    @property
    def pid(self) -> int | None:
        """The container's init process on the host (the server's main process)."""
        return self._init_pid

    def apply_quota(self) -> None:
        """Put the arm's quota in force on the running container (``update``)."""
        if self.quota_cores is None:
            return
        finished = self._runtime(
            "update", "--cpus", f"{self.quota_cores:g}", self.container_id
        )
        if finished.returncode != 0:
            raise ContainerCommandFailed(
                f"`{self.runtime} update --cpus {self.quota_cores:g}` failed: "
                f"{finished.stderr.strip()}; set the arm's quota_timing: start to "
                "give the quota at start instead"
            )
        log.info("quota of %g cores in force", self.quota_cores)

    def settle_after_start(self) -> None:
        """Nothing to move: a container's quota always covers the whole server."""

    def quota_seen_inside(self) -> dict | None:
        """The CPU quota as a process inside the container reads it, or None."""
        if self.container_id is None:
            return None
        finished = self._runtime(
            "exec", self.container_id, "sh", "-c", QUOTA_INSIDE_SCRIPT
        )
        if finished.returncode != 0:
            log.warning("could not read the quota inside: %s", finished.stderr.strip())
            return None
        return parse_quota(finished.stdout)

    def remember_tree(self) -> None:
        """Note every pid of the container (host and namespace pids), for the sweep."""
        if self._init_pid is None:
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self._init_pid)
            self.known_pids.update(child.pid for child in root.children(recursive=True))
        if self.group is not None:
            self.known_pids.update(self.group.pids())
        for pid in self.known_pids:
            inner = namespace_pid(pid)
            if inner is not None:
                self.namespace_pids.add(inner)
        if self.ipc_host:  # a private /dev/shm goes with the container
            made = shutdown_leftovers() - self.shutdown_files_before
            owner = owner_of(self.group_name)
            record_owned(self.group_name, owner, self.namespace_pids, made)

    def exit_code(self) -> int | None:
        """None while the container runs; its exit code once it stopped."""
        if self._exit_code is not None or self.container_id is None:
            return self._exit_code
        if self._log_follower is not None and self._log_follower.poll() is None:
            return None
        state = self._state()
        if state is None or state.get("Running"):
            return None
        self._exit_code = state.get("ExitCode")
        return self._exit_code

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop and remove the container; list and remove the segments it left."""
        try:
            if self.container_id is not None:
                self.remember_tree()
                shared_memory = self._open_shared_memory()
                try:
                    self._lift_quota()
                    self._stop_container(grace_s)
                    if shared_memory is not None:
                        self._sweep_segments(shared_memory)
                finally:
                    if shared_memory is not None:
                        os.close(shared_memory)
        finally:
            try:
                self._remove_container()
            finally:
                self._stop_log_follower()
                if self.ipc_host:
                    # The host's /dev/shm keeps what SGLang's stop leaves by design.
                    remove_unheld(shutdown_leftovers() - self.shutdown_files_before)
                    forget_owned(self.group_name)

    # -- teardown steps

    def _open_shared_memory(self) -> int | None:
        """A descriptor of the container's /dev/shm, kept open across its stop.

        A private /dev/shm is reached through the init process while it lives; the
        open directory stays readable after every process has gone. With the host's
        IPC namespace the container's /dev/shm is the host's.
        """
        if self.ipc_host:
            return os.open(SHARED_MEMORY, os.O_RDONLY | os.O_DIRECTORY)
        if self._init_pid is None:
            return None
        try:
            return os.open(
                f"/proc/{self._init_pid}/root/dev/shm", os.O_RDONLY | os.O_DIRECTORY
            )
        except OSError as error:
            log.warning("cannot open the container's /dev/shm: %s", error)
            return None

    def _lift_quota(self) -> None:
        """Give the container every CPU of this host. ``update --cpus 0`` would
        leave the quota as it was (docker keeps a zero as "unchanged")."""
        if self.quota_cores is None:
            return
        every_cpu = str(os.cpu_count() or 1)
        finished = self._runtime("update", "--cpus", every_cpu, self.container_id)
        if finished.returncode != 0:  # the stop still works, only slower
            log.debug("quota not lifted before the stop: %s", finished.stderr.strip())

    def _stop_container(self, grace_s: float) -> None:
        seconds = str(max(1, math.ceil(grace_s)))
        finished = self._runtime(
            "stop", "--time", seconds, self.container_id, timeout=grace_s + 60
        )
        if finished.returncode != 0:
            log.warning("%s stop failed: %s", self.runtime, finished.stderr.strip())
        # Ask the runtime, not the log follower, which may lag behind the stop.
        state = self._state()
        if state is not None and not state.get("Running"):
            self._exit_code = state.get("ExitCode")

    def _sweep_segments(self, shared_memory: int) -> None:
        """Remove SGLang segments the container's processes left (names recorded).

        In a private /dev/shm every segment is the container's; in the host's, only
        those whose creator pid (a namespace pid) was one of the container's.
        """
        for name in sorted(os.listdir(shared_memory)):
            if not name.startswith(SGLANG_SEGMENT_PREFIX):
                continue
            if self.ipc_host and segment_creator(name) not in self.namespace_pids:
                continue
            self.leaked_segments.append(name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=shared_memory)
        if self.leaked_segments:
            log.warning(
                "removed %d shared-memory segments the server left behind",
                len(self.leaked_segments),
            )

    def _remove_container(self) -> None:
        if self.container_id is None and self._exit_code is not None:
            return  # the runtime refused to create it
        # By name when the start was interrupted before the id came back.
        container = self.container_id or self.name
        finished = self._runtime("rm", "--force", "--volumes", container)
        gone = "no such container" in finished.stderr.lower()
        if finished.returncode != 0 and not gone:
            log.warning("%s rm failed: %s", self.runtime, finished.stderr.strip())
        if self._watchdog is not None:
            container_watchdog.stop(self._watchdog)

    def _stop_log_follower(self) -> None:
        if self._log_follower is None:
            return
        try:
            self._log_follower.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._log_follower.kill()
            self._log_follower.wait()

    def __enter__(self) -> ContainerServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
