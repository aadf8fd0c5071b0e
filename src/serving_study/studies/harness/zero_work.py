"""The zero-work server (`serving_study.studies.zero_work_server`) in a process of
its own, for the client's benchmarks."""

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import psutil

from serving_study.measure.server_queries import wait_until_healthy
from serving_study.servers.local_runtime import free_port

OUTPUT_TOKENS = 32  # the study's output length; the zero-work server sends them at once


@dataclass(frozen=True)
class RunningServer:
    base_url: str
    host: str
    port: int
    process: psutil.Process


@contextlib.contextmanager
def zero_work_server(cpu: int | None, niceness: int | None = None) -> Iterator:
    """Start the zero-work server (pinned to `cpu`) and stop it after."""
    port = free_port()
    argv = [sys.executable, "-m", "serving_study.studies.zero_work_server"]
    argv += ["--port", str(port), "--tokens", str(OUTPUT_TOKENS)]
    if cpu is not None:
        argv += ["--cpu", str(cpu)]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    try:
        if niceness is not None:
            with contextlib.suppress(psutil.AccessDenied):
                psutil.Process(process.pid).nice(niceness)
        wait_until_healthy(base_url, 60, process=process, poll_s=0.05)
        yield RunningServer(base_url, "127.0.0.1", port, psutil.Process(process.pid))
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
