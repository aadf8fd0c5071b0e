"""The CPU the run monitors use at their default rates.

They sample a server-shaped process tree with many threads inside a real cgroup.
"""

import contextlib
import sys
import time
from pathlib import Path

import psutil

from serving_study.launch.plan import process_plan
from serving_study.measure.monitors import RunMonitors
from serving_study.measure.server_processes import find_server_processes
from serving_study.servers.local_runtime import LocalServer
from serving_study.studies.harness.benchmark_host import host_load_between, read_cpu

# A server-shaped process tree: a main process with many idle threads (as an
# OpenMP pool between requests) and a child titled like SGLang's scheduler.
MANY_THREADS_SERVER = """
import subprocess, sys, threading
stop = threading.Event()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=stop.wait, daemon=True).start()
subprocess.Popen([sys.executable, "-c", "import setproctitle, time; "
    "setproctitle.setproctitle('sglang::scheduler'); time.sleep(3600)"])
stop.wait()
"""


def measure_monitor_cpu(
    *,
    window_s: float,
    threads: int,
    sample_hz: float,
    thread_sample_hz: float,
    group_name: str,
    log_path: Path,
) -> dict:
    """CPU the monitors use over one window against a tree with many threads.

    The tree runs in its own cgroup (so the monitors read its `cpu.stat` too) and
    the monitors run in this process, which does nothing else meanwhile: the CPU
    this process uses over the window is what the monitors cost, sampling thread
    and all. The sampler's own account (`sampler_cpu_seconds`) is kept beside it.
    """
    server = LocalServer(
        process_plan([sys.executable, "-c", MANY_THREADS_SERVER, str(threads)]),
        group_name,
        log_path,
    )
    server.start()
    try:
        _wait_for_tree(server, threads + 1)
        monitors = RunMonitors(
            server.pid,
            server.group,
            sample_hz=sample_hz,
            thread_sample_hz=thread_sample_hz,
        )
        try:
            monitors.discover()
            before = read_cpu([psutil.Process(), *_tree(server.pid)])
            cpu_before = time.process_time()
            monitors.start_window()
            time.sleep(window_s)
            figures = monitors.stop_window()
            cpu_used = time.process_time() - cpu_before
            after = read_cpu([psutil.Process(), *_tree(server.pid)])
        finally:
            monitors.stop()
    finally:
        server.stop()
    cost = max(cpu_used, figures["sampler_cpu_seconds"])
    window = figures["window"]["wall_seconds"]
    return {
        "monitor_cpu_fraction": round(cost / window, 5),
        "monitor_cpu_seconds": round(cpu_used, 4),
        "sampler_cpu_seconds": round(figures["sampler_cpu_seconds"], 4),
        "window_s": round(window, 3),
        "sample_hz": sample_hz,
        "thread_sample_hz": thread_sample_hz,
        "samples": figures["window"]["samples"],
        "main_threads_sampled": figures["threads"]["main_max"],
        "scheduler_found": figures["processes"]["scheduler_pid"] is not None,
        "cgroup_read": figures["cgroup"] is not None,
        "gpu": figures["gpu_unavailable_reason"] or "sampled",
        **host_load_between(before, after),
    }


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _wait_for_tree(server: LocalServer, main_threads: int, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group_pids = server.group.pids() if server.group else []
        with contextlib.suppress(psutil.Error):
            found = find_server_processes(server.pid, group_pids)
            if found.scheduler and found.main.num_threads() >= main_threads:
                return
        if server.exit_code() is not None:
            raise RuntimeError(f"the test tree exited: {server.log_tail()}")
        time.sleep(0.05)
    raise RuntimeError(f"the test tree did not start {main_threads} threads in time")
