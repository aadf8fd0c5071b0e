"""The run monitors against real processes shaped like an SGLang server."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from serving_study.measure.monitors import RunMonitors
from serving_study.measure.server_processes import find_server_processes
from serving_study.servers.cgroups import CpuQuotaGroup, QuotaUnavailable, wrap_command

# A main process with a child titled like SGLang's scheduler. Arguments: whether the
# scheduler spins, and how many spinning threads the main process runs.
FAKE_SERVER = """
import multiprocessing, sys, threading, time

def scheduler(busy, titled):
    import setproctitle
    setproctitle.setproctitle("sglang::scheduler_TP0")
    titled.set()
    while busy:
        pass
    time.sleep(600)

def spin():
    while True:
        time.sleep(0)

if __name__ == "__main__":
    titled = multiprocessing.Event()
    child = multiprocessing.Process(
        target=scheduler, args=(sys.argv[1] == "busy", titled), daemon=True
    )
    child.start()
    titled.wait()
    for _ in range(int(sys.argv[2])):
        threading.Thread(target=spin, daemon=True).start()
    print(child.pid, flush=True)
    time.sleep(600)
"""

# A stand-in for a container runtime's init: it starts the server and waits.
FAKE_INIT = """
import subprocess, sys
sys.exit(subprocess.call(sys.argv[1:]))
"""

WINDOW_SECONDS = 1.2


class FakeServer:
    """Starts FAKE_SERVER (optionally below FAKE_INIT or in a cgroup); kills it all."""

    def __init__(
        self, tmp_path, busy_scheduler, main_threads=0, init=False, group=None
    ):
        script = tmp_path / "fake_server.py"
        script.write_text(FAKE_SERVER)
        argv = [sys.executable, str(script), "busy" if busy_scheduler else "idle"]
        argv.append(str(main_threads))
        if init:
            wrapper = tmp_path / "fake_init.py"
            wrapper.write_text(FAKE_INIT)
            argv = [sys.executable, str(wrapper), *argv]
        if group is not None:
            argv = wrap_command(group, argv)
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        self.scheduler_pid = int(self.process.stdout.readline())

    def close(self):
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)
        self.process.stdout.close()


def measure(monitors: RunMonitors, during=None) -> dict:
    try:
        monitors.start_window()
        time.sleep(WINDOW_SECONDS / 2)
        if during is not None:
            during()
        time.sleep(WINDOW_SECONDS / 2)
        return monitors.stop_window()
    finally:
        monitors.stop()


def test_busy_scheduler_and_idle_main_are_told_apart(tmp_path):
    server = FakeServer(tmp_path, busy_scheduler=True)
    try:
        monitors = RunMonitors(server.process.pid, None, gpu=False)
        found = monitors.discover()  # before the load, as the runner does
        assert found.scheduler is not None
        assert found.scheduler.pid == server.scheduler_pid
        figures = measure(monitors)
    finally:
        server.close()
    json.dumps(figures)  # written as monitors.json
    assert figures["processes"]["main_pid"] == server.process.pid
    assert figures["processes"]["scheduler_pid"] == server.scheduler_pid
    # One spinning process uses up to one core (less when the machine is busy with
    # other work); the idle one about none.
    assert 30 < figures["scheduler_cpu_percent"] < 115
    assert figures["main_cpu_percent"] < 10
    assert figures["server_pids_changed"] is False
    assert figures["cgroup"] is None
    assert figures["gpu"] is None
    assert figures["gpu_unavailable_reason"] == "GPU sampling switched off"
    series = figures["series"]
    assert 8 <= len(series) <= 13  # 10 Hz over 1.2 s
    assert [sample["t"] for sample in series] == sorted(s["t"] for s in series)
    assert 20 < sorted(s["scheduler_cpu_percent"] for s in series)[len(series) // 2]
    assert figures["threads"]["main_max"] >= 1


# A main process whose main thread sleeps while another thread hashes (outside
# the GIL), as a server's event loop idles while its OpenMP team spins.
BUSY_WORKER = """
import hashlib, threading, time

def work():
    block = bytes(1 << 20)
    while True:
        hashlib.sha256(block).digest()

threading.Thread(target=work, daemon=True).start()
print("ready", flush=True)
time.sleep(600)
"""


def test_the_main_process_cpu_is_split_between_its_main_thread_and_the_rest(
    tmp_path,
):
    script = tmp_path / "busy_worker.py"
    script.write_text(BUSY_WORKER)
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline() == "ready\n"
        monitors = RunMonitors(process.pid, None, gpu=False)
        monitors.discover()
        figures = measure(monitors)
    finally:
        process.kill()
        process.wait(timeout=10)
        process.stdout.close()
    threads = figures["threads"]
    # The worker takes up to a core (less on a busy machine); the sleeper none.
    assert threads["other_threads_cpu_percent"] > 30
    assert threads["main_thread_cpu_percent"] < 5
    split = threads["main_thread_cpu_percent"] + threads["other_threads_cpu_percent"]
    assert split == pytest.approx(figures["main_cpu_percent"], abs=15)


def test_killing_the_scheduler_marks_the_server_as_changed(tmp_path):
    server = FakeServer(tmp_path, busy_scheduler=False)
    try:
        figures = measure(
            RunMonitors(server.process.pid, None, gpu=False),
            during=lambda: os.kill(server.scheduler_pid, signal.SIGKILL),
        )
    finally:
        server.close()
    assert figures["server_pids_changed"] is True
    assert f"scheduler process {server.scheduler_pid} gone" in figures["server_changes"]
    assert figures["main_cpu_percent"] is not None


def test_an_undisturbed_idle_server_is_not_marked_as_changed(tmp_path):
    server = FakeServer(tmp_path, busy_scheduler=False)
    try:
        figures = measure(RunMonitors(server.process.pid, None, gpu=False))
    finally:
        server.close()
    assert figures["server_pids_changed"] is False
    assert figures["server_changes"] == []
    assert figures["scheduler_cpu_percent"] < 10


def test_the_series_reaches_the_windows_end_even_within_one_period(tmp_path):
    """A run of a few fast requests can end before the first 10 Hz sample: the
    series still reaches the window's end, so it covers the window (the report
    draws each run's CPU from it), and no sample is a sliver of a few ms."""
    server = FakeServer(tmp_path, busy_scheduler=True)
    monitors = RunMonitors(server.process.pid, None, gpu=False)
    windows = []
    try:
        monitors.discover()
        for seconds in (0.03, 0.31, 0.38):
            monitors.start_window()
            time.sleep(seconds)
            windows.append(monitors.stop_window())
    finally:
        monitors.stop()
        server.close()
    for figures in windows:
        series = figures["series"]
        ends = [sample["t"] for sample in series]
        assert ends[-1] == pytest.approx(figures["window"]["wall_seconds"], abs=1e-4)
        assert ends == sorted(ends)
        assert series[-1]["scheduler_cpu_percent"] is not None
        assert figures["window"]["samples"] == len(series)
    assert len(windows[0]["series"]) == 1
    for figures in windows[1:]:
        ends = [0.0] + [sample["t"] for sample in figures["series"]]
        assert ends[-1] - ends[-2] >= 0.05


def test_server_below_an_init_process_in_a_quota_group(tmp_path):
    try:
        group = CpuQuotaGroup.create(f"test-{uuid.uuid4().hex[:10]}", 0.5)
    except QuotaUnavailable as error:
        pytest.skip(f"no writable CPU cgroup here: {error}")
    server = None
    try:
        server = FakeServer(
            tmp_path, busy_scheduler=True, main_threads=3, init=True, group=group
        )
        figures = measure(RunMonitors(server.process.pid, group, gpu=False))
    finally:
        if server is not None:
            server.close()
        group.remove()
    # The init process is the root; the main process is the scheduler's parent.
    processes = figures["processes"]
    assert processes["root_pid"] == server.process.pid
    assert processes["scheduler_pid"] == server.scheduler_pid
    assert processes["main_pid"] not in (server.process.pid, server.scheduler_pid)
    assert len(processes["group_pids_at_start"]) == 3
    # Four spinning threads share a 0.5-core quota, and hit it.
    cgroup = figures["cgroup"]
    assert 0.15 < cgroup["cores_used"] < 0.65
    assert cgroup["nr_throttled"] > 0
    assert cgroup["quota"]["cores"] == pytest.approx(0.5)
    assert figures["main_cpu_percent"] + figures["scheduler_cpu_percent"] == (
        pytest.approx(100 * cgroup["cores_used"], abs=12)
    )
    threads = figures["threads"]
    assert threads["main_max"] >= 4
    assert threads["main_active_in_window"] >= 3
    assert threads["main_active_per_interval_max"] >= 3
    assert all(s["cgroup_cores_used"] is not None for s in figures["series"])


def test_find_server_processes_falls_back_to_the_root(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        found = find_server_processes(process.pid, [])
        assert found.main.pid == process.pid
        assert found.scheduler is None
        assert found.all_pids == {process.pid}
    finally:
        process.kill()
        process.wait()


def test_requiring_a_gpu_where_nvml_is_missing_fails_with_the_reason():
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine")
    except Exception:
        pass
    with pytest.raises(RuntimeError, match="NVML unavailable"):
        RunMonitors(os.getpid(), None, gpu=True)
    monitors = RunMonitors(os.getpid(), None, gpu=None)
    assert "NVML unavailable" in monitors._gpu_unavailable_reason
    monitors.stop()
