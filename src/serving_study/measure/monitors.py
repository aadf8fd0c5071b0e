"""Sample a running server over the measured window: CPU per process, cgroup, GPU.

`RunMonitors` runs in the runner process, outside the server's control group, so its
own CPU is not charged to the arm's quota. It finds the server's processes once when
the window starts (the main HTTP/tokenizer process and the `sglang::scheduler`), then
samples cheap counters from a background thread:

* per process: cumulative CPU time and OS thread count (one read of /proc/<pid>/stat);
* per thread of the main process, at a lower rate: how many threads ran (from
  /proc/<pid>/task/*/schedstat): the OpenMP workers that woke, plus a few others;
* the group's `cpu.stat` (cores used, throttled share);
* GPU utilisation and per-process GPU memory through NVML, when a GPU exists;
* with a ``HostLoadMeter``, the host's other CPU load over the window (host_load.py).

Window figures come from cumulative counters read at the window's start and end, so
they do not depend on the sampling rate; the samples give a time series and
medians/maxima. `stop_window()` returns a JSON-serialisable dict (monitors.json).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import psutil

from serving_study.measure.host_load import HostLoadMeter
from serving_study.servers.cgroups import CpuStat

SCHEDULER_TITLE_PREFIX = "sglang::scheduler"
MAIN_PROCESS_MARKERS = ("sglang.launch_server", "serving_study.engine")
THREAD_ENVIRONMENT_VARIABLES = (
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "MKL_NUM_THREADS",
    "GOMP_SPINCOUNT",
)
GPU_PROCESS_MEMORY_MAX_HZ = 1.0
CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


class ReadableGroup(Protocol):
    """What the monitors need of a control group (CpuGroup or CpuQuotaGroup)."""

    def read_stat(self) -> CpuStat: ...
    def quota_in_force(self) -> dict: ...
    def pids(self) -> list[int]: ...


# --- Finding the server's processes ----------------------------------------------


@dataclass
class ServerProcesses:
    """The processes of one server, as found at the start of a window."""

    main: psutil.Process
    scheduler: psutil.Process | None
    all_pids: set[int]


def _command_line(process: psutil.Process) -> list[str]:
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
    candidates = {root.pid: root}
    for child in root.children(recursive=True):
        candidates[child.pid] = child
    for pid in group_pids:
        if pid not in candidates:
            try:
                candidates[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue
    command_lines = {pid: _command_line(process) for pid, process in candidates.items()}

    titled = sorted(
        (command_line[0], pid)
        for pid, command_line in command_lines.items()
        if command_line and command_line[0].startswith(SCHEDULER_TITLE_PREFIX)
    )
    scheduler = candidates[titled[0][1]] if titled else None

    main = None
    if scheduler is not None:
        parent_pid = scheduler.ppid()
        main = candidates.get(parent_pid)
    if main is None:
        marked = sorted(
            pid
            for pid, command_line in command_lines.items()
            if any(
                marker in part
                for part in command_line
                for marker in MAIN_PROCESS_MARKERS
            )
        )
        # The outermost marked process: a launcher may exec a child with the same args.
        marked_set = set(marked)
        outermost = [pid for pid in marked if candidates[pid].ppid() not in marked_set]
        main = candidates[outermost[0]] if outermost else root
    return ServerProcesses(main=main, scheduler=scheduler, all_pids=set(candidates))


# --- Small readers --------------------------------------------------------------


def _cpu_seconds_and_threads(pid: int) -> tuple[float | None, int | None]:
    """User + system CPU seconds and thread count of a process; None once it exited.

    One read of /proc/<pid>/stat, the counters psutil reads too (a zombie counts as
    exited): at 10 Hz psutil's own per-call work was most of the monitors' CPU.
    """
    try:
        descriptor = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            stat = os.read(descriptor, 4096)
        finally:
            os.close(descriptor)
    except OSError:
        return None, None
    # The fields after the command name, which is in parentheses and may hold spaces:
    # state, then (counting from 0) utime at 11, stime at 12, num_threads at 17.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if not fields or fields[0] == b"Z":
        return None, None
    cpu_seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_SECOND
    return cpu_seconds, int(fields[17])


def _thread_run_nanoseconds(pid: int) -> dict[int, int]:
    """CPU time of every thread of `pid` in ns (schedstat; absent threads skipped).

    Plain os calls on string paths: with hundreds of OpenMP threads this runs once a
    second over hundreds of files, and pathlib would cost four times as much.
    """
    task_directory = f"/proc/{pid}/task/"
    try:
        thread_ids = os.listdir(task_directory)
    except OSError:
        return {}
    run_time = {}
    for thread_id in thread_ids:
        try:
            descriptor = os.open(f"{task_directory}{thread_id}/schedstat", os.O_RDONLY)
            try:
                first_field = os.read(descriptor, 64).split(b" ", 1)[0]
            finally:
                os.close(descriptor)
            run_time[int(thread_id)] = int(first_field)
        except (OSError, ValueError):
            continue
    return run_time


def _environment_of(process: psutil.Process) -> dict[str, str | None]:
    try:
        environment = process.environ()
    except (psutil.Error, OSError):
        return {}
    return {name: environment.get(name) for name in THREAD_ENVIRONMENT_VARIABLES}


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


# --- NVML ---------------------------------------------------------------------------


class _Gpu:
    """One NVML handle, opened once; cheap utilisation reads and 1 Hz process lists."""

    def __init__(self, index: int) -> None:
        import pynvml  # nvidia-ml-py; imported here so CPU hosts never need the driver

        self._nvml = pynvml
        pynvml.nvmlInit()
        try:
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.description = {
                "index": index,
                "name": _text(pynvml.nvmlDeviceGetName(self._handle)),
                "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
            }
        except Exception:
            pynvml.nvmlShutdown()
            raise

    def utilisation(self) -> tuple[float, float]:
        rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        return float(rates.gpu), float(rates.memory)

    def memory_by_pid(self) -> dict[int, int | None]:
        """Used GPU memory per process on the device (host pids), in bytes."""
        processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        return {process.pid: process.usedGpuMemory for process in processes}

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _open_gpu(wanted: bool | None, index: int) -> tuple[_Gpu | None, str | None]:
    """The GPU to sample, or None and why; with `wanted=True` absence is an error."""
    if wanted is False:
        return None, "GPU sampling switched off"
    try:
        return _Gpu(index), None
    except Exception as error:  # ImportError, NVMLError_* (no driver, no device)
        reason = f"NVML unavailable: {type(error).__name__}: {error}"
        if wanted:
            raise RuntimeError(
                f"{reason}. GPU monitoring was requested (gpu=True); install the "
                "NVIDIA driver and nvidia-ml-py, or pass gpu=None to record its "
                "absence."
            ) from error
        return None, reason


# --- The monitors -------------------------------------------------------------------


@dataclass
class _Reading:
    """Counters read at one instant."""

    at: float
    main_cpu: float | None
    scheduler_cpu: float | None
    main_threads: int | None
    group: CpuStat | None


@dataclass
class _Window:
    """State of one measured window, filled by the sampling thread."""

    processes: ServerProcesses
    start: _Reading
    start_epoch: float
    group_pids_at_start: list[int]
    main_environment: dict[str, str | None]
    thread_run_time_at_start: dict[int, int] = field(default_factory=dict)
    series: list[dict] = field(default_factory=list)
    main_thread_counts: list[int] = field(default_factory=list)
    active_threads_per_interval: list[int] = field(default_factory=list)
    gpu_utilisation: list[float] = field(default_factory=list)
    gpu_memory_utilisation: list[float] = field(default_factory=list)
    gpu_server_memory_bytes: list[int] = field(default_factory=list)
    gpu_other_pids: set[int] = field(default_factory=set)
    gpu_errors: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    sampler_cpu_seconds: float = 0.0


class RunMonitors:
    """Samples one server's processes, control group and GPU during measured windows.

    Use: `start_window()` when the measured requests begin, `stop_window()` when they
    end (returns the figures), and `stop()` in a `finally` (ends the sampling thread).
    """

    def __init__(
        self,
        root_pid: int,
        group: ReadableGroup | None,
        sample_hz: float = 10,
        thread_sample_hz: float = 1,
        gpu: bool | None = None,
        gpu_index: int = 0,
        host_load: HostLoadMeter | None = None,
    ) -> None:
        if sample_hz <= 0:
            raise ValueError(f"sample_hz must be positive, got {sample_hz}.")
        self.root_pid = root_pid
        self.group = group
        self.sample_hz = sample_hz
        self.thread_sample_hz = thread_sample_hz
        self.host_load = host_load
        self._gpu, self._gpu_unavailable_reason = _open_gpu(gpu, gpu_index)
        self._window: _Window | None = None
        self._discovered: (
            tuple[ServerProcesses, list[int], dict[str, str | None]] | None
        ) = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- window control

    def discover(self) -> ServerProcesses:
        """Find the server's processes now (a few ms); start_window() reuses them.

        Call it before the load starts so that start_window(), which may run on the
        client's event loop at the warm-up/measured boundary, only reads counters.
        """
        group_pids = self.group.pids() if self.group is not None else []
        processes = find_server_processes(self.root_pid, group_pids)
        self._discovered = (processes, group_pids, _environment_of(processes.main))
        return processes

    def start_window(self) -> None:
        """Read the starting counters and start sampling (discovers if not done)."""
        if self._thread is not None:
            raise RuntimeError("A window is already open; call stop_window() first.")
        cost_started = time.thread_time()
        if self._discovered is None or not self._discovered[0].main.is_running():
            self.discover()
        assert self._discovered is not None
        processes, group_pids, main_environment = self._discovered
        start = self._read(processes)
        if self.host_load is not None:
            self.host_load.start()
        window = _Window(
            processes=processes,
            start=start,
            start_epoch=time.time() - (time.monotonic() - start.at),
            group_pids_at_start=group_pids,
            main_environment=main_environment,
        )
        window.sampler_cpu_seconds += time.thread_time() - cost_started
        self._window = window
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._sample_until_stopped,
            args=(window,),
            name="run-monitors",
            daemon=True,
        )
        self._thread.start()

    def stop_window(self) -> dict:
        """Stop sampling and return the window's figures (JSON-serialisable)."""
        window = self._window
        if window is None:
            raise RuntimeError("No window is open; call start_window() first.")
        self._end_thread()
        cost_started = time.thread_time()
        end = self._read(window.processes)
        host_load = self.host_load.stop() if self.host_load is not None else None
        thread_run_time_at_end = self._read_threads(window.processes)
        group_pids_at_end = self.group.pids() if self.group is not None else []
        self._check_same_server(window, end)
        window.sampler_cpu_seconds += time.thread_time() - cost_started
        self._window = None
        figures = self._figures(window, end, thread_run_time_at_end, group_pids_at_end)
        figures["host_load"] = host_load
        return figures

    def stop(self) -> None:
        """End the sampling thread and release NVML; safe to call at any time."""
        self._end_thread()
        self._window = None
        self._discovered = None
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None

    def __enter__(self) -> RunMonitors:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _end_thread(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- reading

    def _read(self, processes: ServerProcesses) -> _Reading:
        main_cpu, main_threads = _cpu_seconds_and_threads(processes.main.pid)
        scheduler_cpu = None
        if processes.scheduler is not None:
            scheduler_cpu, _ = _cpu_seconds_and_threads(processes.scheduler.pid)
        group = self.group.read_stat() if self.group is not None else None
        return _Reading(time.monotonic(), main_cpu, scheduler_cpu, main_threads, group)

    def _read_threads(self, processes: ServerProcesses) -> dict[int, int]:
        if self.thread_sample_hz <= 0:
            return {}
        return _thread_run_nanoseconds(processes.main.pid)

    # -- the sampling thread

    def _sample_until_stopped(self, window: _Window) -> None:
        cost_started = time.thread_time()
        sample_period = 1 / self.sample_hz
        thread_period = 1 / self.thread_sample_hz if self.thread_sample_hz > 0 else None
        gpu_memory_period = 1 / GPU_PROCESS_MEMORY_MAX_HZ
        started = window.start.at
        previous = window.start
        # Read here, not in start_window(): with hundreds of threads it takes ms.
        window.thread_run_time_at_start = self._read_threads(window.processes)
        previous_threads = window.thread_run_time_at_start
        next_thread_sample = started + (thread_period or 0)
        next_gpu_memory_sample = started
        sample_number = 0
        try:
            while True:
                sample_number += 1
                due = started + sample_number * sample_period
                if self._stopping.wait(max(0.0, due - time.monotonic())):
                    break
                reading = self._read(window.processes)
                self._note_missing_processes(window, reading)
                window.series.append(self._sample(window, previous, reading))
                previous = reading
                now = reading.at
                if thread_period is not None and now >= next_thread_sample:
                    current = _thread_run_nanoseconds(window.processes.main.pid)
                    window.active_threads_per_interval.append(
                        _count_threads_that_ran(previous_threads, current)
                    )
                    previous_threads = current
                    next_thread_sample = now + thread_period
                if self._gpu is not None and now >= next_gpu_memory_sample:
                    self._sample_gpu_memory(window)
                    next_gpu_memory_sample = now + gpu_memory_period
        finally:
            window.sampler_cpu_seconds += time.thread_time() - cost_started

    def _sample(self, window: _Window, previous: _Reading, reading: _Reading) -> dict:
        interval = reading.at - previous.at
        sample = {
            "t": round(reading.at - window.start.at, 4),
            "main_cpu_percent": _percent(previous.main_cpu, reading.main_cpu, interval),
            "scheduler_cpu_percent": _percent(
                previous.scheduler_cpu, reading.scheduler_cpu, interval
            ),
            "main_threads": reading.main_threads,
            "cgroup_cores_used": None,
            "cgroup_throttled_share": None,
        }
        if reading.main_threads is not None:
            window.main_thread_counts.append(reading.main_threads)
        if previous.group is not None and reading.group is not None:
            delta = previous.group.delta(reading.group)
            sample["cgroup_cores_used"] = delta["cores_used"]
            sample["cgroup_throttled_share"] = delta["throttled_share"]
        if self._gpu is not None:
            try:
                gpu_percent, memory_percent = self._gpu.utilisation()
                window.gpu_utilisation.append(gpu_percent)
                window.gpu_memory_utilisation.append(memory_percent)
                sample["gpu_util_percent"] = gpu_percent
            except Exception as error:  # NVMLError: record, keep sampling the CPU side
                _note_once(window.gpu_errors, f"utilisation: {error}")
        return sample

    def _sample_gpu_memory(self, window: _Window) -> None:
        assert self._gpu is not None
        try:
            memory_by_pid = self._gpu.memory_by_pid()
        except Exception as error:
            _note_once(window.gpu_errors, f"process list: {error}")
            return
        server_pids = window.processes.all_pids
        window.gpu_server_memory_bytes.append(
            sum(used or 0 for pid, used in memory_by_pid.items() if pid in server_pids)
        )
        window.gpu_other_pids |= set(memory_by_pid) - server_pids

    # -- restarts

    def _note_missing_processes(self, window: _Window, reading: _Reading) -> None:
        if reading.main_cpu is None:
            _note_once(window.changes, f"main process {window.processes.main.pid} gone")
        scheduler = window.processes.scheduler
        if scheduler is not None and reading.scheduler_cpu is None:
            _note_once(window.changes, f"scheduler process {scheduler.pid} gone")

    def _check_same_server(self, window: _Window, end: _Reading) -> None:
        """A restart shows as a main or scheduler process that died or was replaced."""
        self._note_missing_processes(window, end)
        known = window.processes
        for role, process in (("main", known.main), ("scheduler", known.scheduler)):
            if process is not None and not process.is_running():
                _note_once(window.changes, f"{role} process {process.pid} gone")
        try:
            group_pids = self.group.pids() if self.group is not None else []
            found = find_server_processes(self.root_pid, group_pids)
        except psutil.Error:
            _note_once(window.changes, f"root process {self.root_pid} gone")
            return
        if found.main.pid != known.main.pid:
            _note_once(window.changes, f"main process now {found.main.pid}")
        found_scheduler = found.scheduler.pid if found.scheduler else None
        known_scheduler = known.scheduler.pid if known.scheduler else None
        if found_scheduler != known_scheduler:
            _note_once(window.changes, f"scheduler process now {found_scheduler}")

    # -- the result

    def _figures(
        self,
        window: _Window,
        end: _Reading,
        thread_run_time_at_end: dict[int, int],
        group_pids_at_end: list[int],
    ) -> dict:
        start = window.start
        wall_seconds = end.at - start.at
        processes = window.processes
        thread_counts = _spread(window.main_thread_counts) or {}
        active = _spread(window.active_threads_per_interval) or {}
        figures = {
            "window": {
                "start_epoch": window.start_epoch,
                "end_epoch": window.start_epoch + wall_seconds,
                "start_monotonic": start.at,
                "end_monotonic": end.at,
                "wall_seconds": wall_seconds,
                "sample_hz": self.sample_hz,
                "thread_sample_hz": self.thread_sample_hz,
                "samples": len(window.series),
            },
            "processes": {
                "root_pid": self.root_pid,
                "main_pid": processes.main.pid,
                "main_command": " ".join(_command_line(processes.main))[:300],
                "scheduler_pid": processes.scheduler.pid
                if processes.scheduler
                else None,
                "group_pids_at_start": window.group_pids_at_start,
                "group_pids_at_end": group_pids_at_end,
            },
            "server_pids_changed": bool(window.changes),
            "server_changes": window.changes,
            "main_cpu_percent": _percent(start.main_cpu, end.main_cpu, wall_seconds),
            "scheduler_cpu_percent": _percent(
                start.scheduler_cpu, end.scheduler_cpu, wall_seconds
            ),
            "threads": {
                "main_median": thread_counts.get("median"),
                "main_min": thread_counts.get("min"),
                "main_max": thread_counts.get("max"),
                "main_active_per_interval_median": active.get("median"),
                "main_active_per_interval_max": active.get("max"),
                "main_active_in_window": (
                    _count_threads_that_ran(
                        window.thread_run_time_at_start, thread_run_time_at_end
                    )
                    if thread_run_time_at_end
                    else None
                ),
                "main_environment": window.main_environment,
                **_main_process_split(
                    window.thread_run_time_at_start,
                    thread_run_time_at_end,
                    processes.main.pid,
                    wall_seconds,
                ),
            },
            "cgroup": None,
            "gpu": None,
            "gpu_unavailable_reason": self._gpu_unavailable_reason,
            "sampler_cpu_seconds": window.sampler_cpu_seconds,
            "series": window.series,
        }
        if self.group is not None and start.group is not None and end.group is not None:
            figures["cgroup"] = {
                **start.group.delta(end.group),
                "quota": self.group.quota_in_force(),
            }
        if self._gpu is not None:
            figures["gpu"] = self._gpu_figures(window)
        return figures

    def _gpu_figures(self, window: _Window) -> dict:
        assert self._gpu is not None
        utilisation = _spread(window.gpu_utilisation) or {}
        memory_utilisation = _spread(window.gpu_memory_utilisation) or {}
        server_memory = window.gpu_server_memory_bytes
        return {
            **self._gpu.description,
            "util_percent_mean": utilisation.get("mean"),
            "util_percent_median": utilisation.get("median"),
            "util_percent_max": utilisation.get("max"),
            "memory_util_percent_mean": memory_utilisation.get("mean"),
            "memory_used_mib": max(server_memory) / 2**20 if server_memory else None,
            "utilisation_samples": len(window.gpu_utilisation),
            "process_list_samples": len(server_memory),
            "other_compute_pids": sorted(window.gpu_other_pids),
            "errors": window.gpu_errors,
        }


def _main_process_split(
    start: dict[int, int], end: dict[int, int], main_pid: int, seconds: float
) -> dict:
    """Where the main process's CPU went over the window, as percents of one core:
    its main thread (the event loop) and all its other threads (the intra-op
    OpenMP team and helper threads). A thread born in the window counts from zero;
    one that ended in it is missing from ``end`` and not counted."""
    if not end or seconds <= 0:
        return {"main_thread_cpu_percent": None, "other_threads_cpu_percent": None}
    used = {
        thread: run_time - start.get(thread, 0)
        for thread, run_time in end.items()
        if run_time >= start.get(thread, 0)
    }
    main = used.get(main_pid, 0)
    others = sum(used.values()) - main
    return {
        "main_thread_cpu_percent": 100 * main / 1e9 / seconds,
        "other_threads_cpu_percent": 100 * others / 1e9 / seconds,
    }


def _percent(before: float | None, after: float | None, seconds: float) -> float | None:
    """CPU seconds spent between two readings, as a percent of one core."""
    if before is None or after is None or seconds <= 0:
        return None
    return 100 * (after - before) / seconds


def _count_threads_that_ran(before: dict[int, int], after: dict[int, int]) -> int:
    """Threads that used CPU between two readings (new threads count if they ran)."""
    return sum(1 for tid, ns in after.items() if ns > before.get(tid, 0))


def _note_once(notes: list[str], note: str) -> None:
    if note not in notes:
        notes.append(note)
