"""Sample a running server over the measured window: CPU per process, cgroup, GPU.

`RunMonitors` runs in the runner process, outside the server's control group, so its
own CPU is not charged to the arm's quota. It finds the server's processes once when
the window starts (server_processes.py: the main HTTP/tokenizer process and the
`sglang::scheduler`), then samples cheap counters from a background thread:

* per process: cumulative CPU time and OS thread count (process_counters.py);
* per thread of the main process, at a lower rate: how many threads ran (their
  run time, thread_cpu.py): the OpenMP workers that woke, plus a few others;
* the group's `cpu.stat` (cores used, throttled share; process_counters.py);
* GPU utilisation and per-process GPU memory through NVML, when a GPU exists
  (gpu_sampling.py);
* with a ``HostLoadMeter``, the host's other CPU load over the window (host_load.py).

Window figures come from cumulative counters read at the window's start and end, so
they do not depend on the sampling rate; the samples give a time series and
medians/maxima.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

import psutil

from serving_study.measure.gpu_sampling import (
    GPU_PROCESS_MEMORY_MAX_HZ,
    GpuSamples,
    open_gpu,
)
from serving_study.measure.host_load import HostLoadMeter
from serving_study.measure.process_counters import (
    CounterReading,
    percent,
    read_counters,
)
from serving_study.measure.server_processes import (
    ServerProcesses,
    command_line,
    find_server_processes,
    thread_environment,
)
from serving_study.measure.thread_cpu import (
    main_thread_split,
    read_thread_run_time,
    threads_that_ran,
)
from serving_study.servers.cpu_group import CpuGroup


@dataclass
class _Window:
    """State of one measured window, filled by the sampling thread."""

    processes: ServerProcesses
    start: CounterReading
    start_epoch: float
    group_pids_at_start: list[int]
    main_environment: dict[str, str | None]
    thread_run_time_at_start: dict[int, int] = field(default_factory=dict)
    series: list[dict] = field(default_factory=list)
    last_span: tuple[CounterReading, CounterReading] | None = None
    main_thread_counts: list[int] = field(default_factory=list)
    active_threads_per_interval: list[int] = field(default_factory=list)
    gpu: GpuSamples = field(default_factory=GpuSamples)
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
        group: CpuGroup | None,
        sample_hz: float = 10,
        thread_sample_hz: float = 1,
        gpu: bool | None = None,
        host_load: HostLoadMeter | None = None,
    ) -> None:
        if sample_hz <= 0:
            raise ValueError(f"sample_hz must be positive, got {sample_hz}.")
        self.root_pid = root_pid
        self.group = group
        self.sample_hz = sample_hz
        self.thread_sample_hz = thread_sample_hz
        self.host_load = host_load
        self._gpu, self._gpu_unavailable_reason = open_gpu(gpu)
        self._window: _Window | None = None
        self._discovered: (
            tuple[ServerProcesses, list[int], dict[str, str | None]] | None
        ) = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def discover(self) -> ServerProcesses:
        """Find the server's processes now (a few ms); start_window() reuses them.

        Call it before the load starts so that start_window(), which may run on the
        client's event loop at the warm-up/measured boundary, only reads counters.
        """
        group_pids = self.group.pids() if self.group is not None else []
        processes = find_server_processes(self.root_pid, group_pids)
        self._discovered = (processes, group_pids, thread_environment(processes.main))
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
        start = read_counters(processes, self.group)
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
        """Stop sampling and return the window's figures (monitors.json)."""
        window = self._window
        if window is None:
            raise RuntimeError("No window is open; call start_window() first.")
        self._end_thread()
        cost_started = time.thread_time()
        end = read_counters(window.processes, self.group)
        self._close_series(window, end)
        host_load = self.host_load.stop() if self.host_load is not None else None
        thread_run_time_at_end = self._read_threads(window.processes)
        group_pids_at_end = self.group.pids() if self.group is not None else []
        self._check_same_server(window, end)
        window.sampler_cpu_seconds += time.thread_time() - cost_started
        self._window = None
        figures = self._figures(window, end, thread_run_time_at_end, group_pids_at_end)
        return figures | {"host_load": host_load}

    def _close_series(self, window: _Window, end: CounterReading) -> None:
        """Make the series end at the window's end, so that a window shorter than
        one period still has its sample. The time since the last periodic sample
        is one more sample, or, when shorter than half a period, joins the last
        one: CPU counters tick every 10 ms, and a sample of a few ms alone in its
        bin would draw as a spike of hundreds of percent."""
        since = window.start
        if window.last_span is not None:
            before_last, last = window.last_span
            if end.at - last.at >= 0.5 / self.sample_hz:
                since = last
            else:
                window.series.pop()
                since = before_last
        if end.at > since.at:
            window.series.append(self._sample(window, since, end))

    def stop(self) -> None:
        """End the sampling thread and release NVML; safe to call at any time."""
        self._end_thread()
        self._window = None
        self._discovered = None
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None

    def _end_thread(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _read_threads(self, processes: ServerProcesses) -> dict[int, int]:
        """The main process's threads' run time; empty when not sampled or gone."""
        if self.thread_sample_hz <= 0:
            return {}
        try:
            return read_thread_run_time(processes.main.pid)
        except OSError:
            return {}

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
                reading = read_counters(window.processes, self.group)
                self._note_missing_processes(window, reading)
                window.series.append(self._sample(window, previous, reading))
                window.last_span = (previous, reading)
                previous = reading
                now = reading.at
                if thread_period is not None and now >= next_thread_sample:
                    current = self._read_threads(window.processes)
                    window.active_threads_per_interval.append(
                        threads_that_ran(previous_threads, current)
                    )
                    previous_threads = current
                    next_thread_sample = now + thread_period
                if self._gpu is not None and now >= next_gpu_memory_sample:
                    self._gpu.sample_memory(window.gpu, window.processes.all_pids)
                    next_gpu_memory_sample = now + gpu_memory_period
        finally:
            window.sampler_cpu_seconds += time.thread_time() - cost_started

    def _sample(
        self, window: _Window, previous: CounterReading, reading: CounterReading
    ) -> dict:
        interval = reading.at - previous.at
        cgroup = {}
        if previous.group is not None and reading.group is not None:
            cgroup = previous.group.delta(reading.group)
        sample = {
            "t": round(reading.at - window.start.at, 4),
            "main_cpu_percent": percent(previous.main_cpu, reading.main_cpu, interval),
            "scheduler_cpu_percent": percent(
                previous.scheduler_cpu, reading.scheduler_cpu, interval
            ),
            "main_threads": reading.main_threads,
            "cgroup_cores_used": cgroup.get("cores_used"),
            "cgroup_throttled_share": cgroup.get("throttled_share"),
        }
        if reading.main_threads is not None:
            window.main_thread_counts.append(reading.main_threads)
        if self._gpu is not None:
            gpu_percent = self._gpu.sample_utilisation(window.gpu)
            if gpu_percent is not None:
                sample["gpu_util_percent"] = gpu_percent
        return sample

    def _note_missing_processes(self, window: _Window, reading: CounterReading) -> None:
        if reading.main_cpu is None:
            _note_once(window.changes, f"main process {window.processes.main.pid} gone")
        scheduler = window.processes.scheduler
        if scheduler is not None and reading.scheduler_cpu is None:
            _note_once(window.changes, f"scheduler process {scheduler.pid} gone")

    def _check_same_server(self, window: _Window, end: CounterReading) -> None:
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

    def _figures(
        self,
        window: _Window,
        end: CounterReading,
        run_time_at_end: dict[int, int],
        group_pids_at_end: list[int],
    ) -> dict:
        start = window.start
        run_time_at_start = window.thread_run_time_at_start
        wall_seconds = end.at - start.at
        processes = window.processes
        counts = window.main_thread_counts
        active = window.active_threads_per_interval
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
                "main_command": " ".join(command_line(processes.main))[:300],
                "scheduler_pid": processes.scheduler.pid
                if processes.scheduler
                else None,
                "group_pids_at_start": window.group_pids_at_start,
                "group_pids_at_end": group_pids_at_end,
            },
            "server_pids_changed": bool(window.changes),
            "server_changes": window.changes,
            "main_cpu_percent": percent(start.main_cpu, end.main_cpu, wall_seconds),
            "scheduler_cpu_percent": percent(
                start.scheduler_cpu, end.scheduler_cpu, wall_seconds
            ),
            "threads": {
                "main_median": statistics.median(counts) if counts else None,
                "main_min": min(counts, default=None),
                "main_max": max(counts, default=None),
                "main_active_per_interval_median": (
                    statistics.median(active) if active else None
                ),
                "main_active_per_interval_max": max(active, default=None),
                "main_active_in_window": (
                    threads_that_ran(run_time_at_start, run_time_at_end)
                    if run_time_at_end
                    else None
                ),
                "main_environment": window.main_environment,
                **main_thread_split(
                    run_time_at_start, run_time_at_end, processes.main.pid, wall_seconds
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
            figures["gpu"] = self._gpu.figures(window.gpu)
        return figures


def _note_once(notes: list[str], note: str) -> None:
    if note not in notes:
        notes.append(note)
