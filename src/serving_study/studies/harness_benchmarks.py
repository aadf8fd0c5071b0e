"""Benchmarks of the harness itself: only the server may limit what a run measures.

A benchmark harness can end up measuring itself: a Python client that cannot send
fast enough, a monitor that eats the CPU the server needs, a start-up that dwarfs the
measured window. Each section below measures one part of this harness in one run and
returns a JSON-ready dict; `run_benchmarks` gathers them, with the host they ran on,
into `results/benchmarks/harness.json`:

* the client's highest sustained request rate and its time-to-first-token overhead,
  against `zero_work_server` (a server that answers at once), the client pinned to
  one CPU and the server to another;
* that a client which falls behind its schedule makes a run invalid;
* the CPU the run monitors use at their default rates, sampling a process tree with
  many threads inside a real cgroup;
* the copy into shared memory of each variant's own `ShmPointerMMData` beside this
  host's single-thread memcpy, in a fresh process with the server's default threads;
* the wall time of one real embedded arm beyond its measured window, phase by phase;
* the wall time of the whole default study, from Snakemake's job records.

Speeds are figures here, never test assertions: the host is shared and small, so every
section also records how busy the host was while it ran.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import ctypes
import json
import logging
import mmap
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil

from serving_study.measure import http1
from serving_study.measure.arm_runner import RunPaths, run_arm
from serving_study.measure.client import (
    JSON,
    ChatRequest,
    load_requests,
    run_load,
    wait_until_healthy,
)
from serving_study.measure.monitors import RunMonitors, find_server_processes
from serving_study.measure.run_metrics import (
    percentile,
    read_request_log,
    summarize_run,
)
from serving_study.servers import host
from serving_study.servers.environment import server_environment
from serving_study.servers.local_runtime import LocalServer, free_port
from serving_study.studies.zero_work_server import MODEL as ZERO_WORK_MODEL

log = logging.getLogger(__name__)

OUTPUT_TOKENS = 32  # the study's output length; the zero-work server sends them at once
BYTES_PER_GB = 1e9
MEMCPY_SEGMENT_PREFIX = "harness_memcpy_"  # + creator pid: segments of the memcpy runs
# Client, zero-work server and copies run at this niceness (when allowed: root), so
# that what other processes do on a shared host enters their figures as little as
# possible. The real arm runs at the default niceness, as the study's arms do.
BENCHMARK_NICENESS = -10

# The goals of the harness (issue 7): each figure and the bound it must meet.
GOALS = {
    "client_headroom_ratio": (">=", 20.0),
    "client_ttft_overhead_ms_p50": ("<=", 1.0),
    "monitor_cpu_fraction": ("<=", 0.01),
    "arm_overhead_s": ("<=", 5.0),
    "shm_copy_patched_to_memcpy_ratio": (">=", 0.8),
}


# --- The host and how busy it is --------------------------------------------------


def describe_benchmark_host(client_cpu: int, server_cpu: int) -> dict:
    """What the figures were measured on, and where client and server ran."""
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpu_model": host.cpu_model(),
        "cpu_count": os.cpu_count(),
        "visible_cpus": sorted(os.sched_getaffinity(0)),
        "memory_gib": host.memory_gib(),
        "cgroup_version": host.cgroup_version(),
        "gpu": host.gpu_description(),
        "versions": host.package_versions(),
        "client_cpu": client_cpu,
        "zero_work_server_cpu": server_cpu,
        "load_average_at_start": [round(load, 2) for load in os.getloadavg()],
    }


def client_and_server_cpus() -> tuple[int, int]:
    """Two different visible CPUs for client and server (the same one if only one)."""
    visible = sorted(os.sched_getaffinity(0))
    return visible[0], visible[-1]


@dataclass(frozen=True)
class CpuReading:
    """Host-wide busy CPU seconds and the CPU seconds of our processes, at once."""

    at: float
    host_busy_seconds: float
    own_seconds: float | None  # None: our processes are not all known


def read_cpu(own_processes: list[psutil.Process] | None = None) -> CpuReading:
    times = psutil.cpu_times()
    busy = times.user + times.nice + times.system + times.irq + times.softirq
    if own_processes is None:
        return CpuReading(time.monotonic(), busy, None)
    own = 0.0
    for process in own_processes:
        with contextlib.suppress(psutil.Error):
            process_times = process.cpu_times()
            own += process_times.user + process_times.system
    return CpuReading(time.monotonic(), busy, own)


def host_load_between(before: CpuReading, after: CpuReading) -> dict:
    """Cores the whole host kept busy, and how many of them other processes used."""
    wall = after.at - before.at
    if wall <= 0:
        return {"host_busy_cores": None}
    busy = (after.host_busy_seconds - before.host_busy_seconds) / wall
    load = {"host_busy_cores": round(busy, 3)}
    if before.own_seconds is not None and after.own_seconds is not None:
        own = (after.own_seconds - before.own_seconds) / wall
        load["other_processes_cores"] = round(max(0.0, busy - own), 3)
    return load


@contextlib.contextmanager
def raised_priority(niceness: int = BENCHMARK_NICENESS) -> Iterator[bool]:
    """Run the calling thread at `niceness`, then restore; yields whether it could."""
    previous = os.getpriority(os.PRIO_PROCESS, 0)  # on Linux: this thread's
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except PermissionError:
        yield False
        return
    try:
        yield True
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, previous)


@contextlib.contextmanager
def pinned_to(cpu: int) -> Iterator[None]:
    """Run the calling thread (and threads it starts) on one CPU, then restore."""
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


# --- The zero-work server ---------------------------------------------------------


@dataclass(frozen=True)
class RunningServer:
    base_url: str
    host: str
    port: int
    process: psutil.Process


@contextlib.contextmanager
def zero_work_server(
    cpu: int | None, tokens: int = OUTPUT_TOKENS, niceness: int | None = None
) -> Iterator:
    """Start the zero-work server (pinned to `cpu`) and stop it after."""
    port = free_port()
    argv = [sys.executable, "-m", "serving_study.studies.zero_work_server"]
    argv += ["--port", str(port), "--tokens", str(tokens)]
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


# --- Client: highest sustained rate -----------------------------------------------


def measure_client_rate(
    chat_requests: list[ChatRequest],
    server: RunningServer,
    *,
    client_cpu: int,
    concurrencies: list[int],
    measured_requests: int,
    study_peak_rps: float,
    out_dir: Path,
) -> dict:
    """The client's request rate at each concurrency, pinned to one CPU.

    Each level is one closed loop (a warm-up of two requests per slot, then the
    measured ones); its rate is completed measured requests over the window from
    the first measured send to the last measured end, as a run's throughput is.
    The best level is the client's sustained maximum. Whoever saturated its CPU
    (client or server) is what limited the level.
    """
    levels = []
    for concurrency in concurrencies:
        with pinned_to(client_cpu):
            client = psutil.Process()
            before = read_cpu([client, server.process])
            client_before = _process_cpu_seconds(client)
            server_before = _process_cpu_seconds(server.process)
            summary = asyncio.run(
                run_load(
                    server.base_url,
                    chat_requests,
                    concurrency=concurrency,
                    measured_requests=measured_requests,
                    warmup_requests=2 * concurrency,
                    output_tokens=OUTPUT_TOKENS,
                    model=ZERO_WORK_MODEL,
                    out_path=out_dir / f"client-rate-c{concurrency}.jsonl",
                    progress=False,
                )
            )
            after = read_cpu([client, server.process])
        wall = after.at - before.at
        window = (summary.measured_end_s or 0) - (summary.measured_start_s or 0)
        client_share = (_process_cpu_seconds(client) - client_before) / wall
        server_share = (_process_cpu_seconds(server.process) - server_before) / wall
        levels.append(
            {
                "concurrency": concurrency,
                "measured_requests": measured_requests,
                "completed": summary.measured_ok,
                "errors": summary.measured_errors + summary.warmup_errors,
                "window_s": round(window, 3),
                "rps": round(summary.measured_ok / window, 1) if window > 0 else None,
                "client_cpu_ms_per_request": round(
                    1000
                    * summary.client_cpu_seconds
                    / (2 * concurrency + measured_requests),
                    4,
                ),
                "client_cpu_share": round(client_share, 3),
                "server_cpu_share": round(server_share, 3),
                "limited_by": _limited_by(client_share, server_share),
                "max_dispatch_lag_ms": summary.max_dispatch_lag_ms,
                **host_load_between(before, after),
            }
        )
    rated = [level for level in levels if level["rps"] and not level["errors"]]
    best = max(rated, key=lambda level: level["rps"], default=None)
    client_max_rps = best["rps"] if best else None
    cheapest = min(level["client_cpu_ms_per_request"] for level in levels)
    return {
        "client_max_rps": client_max_rps,
        # What one free core would sustain if the client were only CPU-bound.
        "client_rps_per_free_core": round(1000 / cheapest) if cheapest else None,
        "client_headroom_ratio": (
            round(client_max_rps / study_peak_rps, 1) if client_max_rps else None
        ),
        "study_peak_rps": study_peak_rps,
        "workload_images": len(chat_requests),
        "request_body_bytes_median": statistics.median(
            len(request.messages_json) for request in chat_requests
        ),
        "best_concurrency": best["concurrency"] if best else None,
        "levels": levels,
    }


def _process_cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _limited_by(client_share: float, server_share: float) -> str:
    """Which side ran out of CPU: the one that kept its core 90% busy."""
    if client_share >= 0.9 and client_share >= server_share:
        return "client"
    if server_share >= 0.9:
        return "server"
    return "neither (latency-bound or the host was busy)"


# --- Client: time-to-first-token overhead -----------------------------------------

FIRST_TOKEN = re.compile(rb'"content": ?"[^"]')
LAST_CHUNK = b"\r\n0\r\n\r\n"  # the end of a chunked HTTP/1.1 body


def raw_socket_ttfts(
    server: RunningServer, bodies: list[bytes], count: int, warmup: int
) -> list[float]:
    """TTFTs in ms of the least a client can do: one blocking keep-alive socket.

    Each request is written whole with one `sendall`; the first token is the first
    event whose content is not empty, found by a byte search as the bytes arrive;
    the response is read to its last chunk before the next request goes.
    """
    endpoint = http1.Endpoint.from_url(f"{server.base_url}/v1/chat/completions")
    # The very bytes the load client sends.
    messages = [http1.prepare_post(endpoint, body, JSON) for body in bodies]
    ttfts = []
    with socket.create_connection((server.host, server.port)) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for index in range(warmup + count):
            sent_at = time.monotonic()
            connection.sendall(messages[index % len(messages)])
            first_token_at = None
            received = b""
            while not (received.endswith(LAST_CHUNK) and b"[DONE]" in received):
                data = connection.recv(1 << 18)
                if not data:
                    raise ConnectionError("the server closed the connection")
                received += data
                if first_token_at is None and FIRST_TOKEN.search(received):
                    first_token_at = time.monotonic()
            if first_token_at is None:
                raise ValueError("a response held no token")
            if index >= warmup:
                ttfts.append(1000 * (first_token_at - sent_at))
    return ttfts


def measure_ttft_overhead(
    chat_requests: list[ChatRequest],
    server: RunningServer,
    *,
    client_cpu: int,
    requests_per_round: int,
    rounds: int,
    out_dir: Path,
) -> dict:
    """Client TTFT minus raw-socket TTFT, p50, one request at a time, same server.

    The two clients alternate in rounds on the same CPU, so a change of the host's
    load affects both alike.
    """
    bodies = [
        request.body(model=ZERO_WORK_MODEL, output_tokens=OUTPUT_TOKENS)
        for request in chat_requests
    ]
    warmup = max(1, requests_per_round // 10)
    raw: list[float] = []
    harness: list[float] = []
    per_round: list[float] = []
    client = psutil.Process()
    before = read_cpu([client, server.process])
    with pinned_to(client_cpu):
        for round_number in range(rounds):
            round_raw = raw_socket_ttfts(server, bodies, requests_per_round, warmup)
            log_path = out_dir / f"ttft-round{round_number + 1}.jsonl"
            asyncio.run(
                run_load(
                    server.base_url,
                    chat_requests,
                    concurrency=1,
                    measured_requests=requests_per_round,
                    warmup_requests=warmup,
                    output_tokens=OUTPUT_TOKENS,
                    model=ZERO_WORK_MODEL,
                    out_path=log_path,
                    progress=False,
                )
            )
            round_harness = [
                record["ttft_ms"]
                for record in read_request_log(log_path)
                if record["phase"] == "measured" and record["ttft_ms"] is not None
            ]
            raw += round_raw
            harness += round_harness
            per_round.append(percentile(round_harness, 50) - percentile(round_raw, 50))
    after = read_cpu([client, server.process])
    raw_p50, harness_p50 = percentile(raw, 50), percentile(harness, 50)
    return {
        "client_ttft_overhead_ms_p50": round(harness_p50 - raw_p50, 3),
        # The same difference within each round, then its median: less sensitive to
        # the host's load changing between rounds.
        "overhead_ms_median_of_rounds": round(statistics.median(per_round), 3),
        "client_ttft_ms_p50": round(harness_p50, 3),
        "raw_socket_ttft_ms_p50": round(raw_p50, 3),
        "client_ttft_ms_p90": round(percentile(harness, 90), 3),
        "raw_socket_ttft_ms_p90": round(percentile(raw, 90), 3),
        "requests_each": len(raw),
        "rounds": rounds,
        **host_load_between(before, after),
    }


# --- Client: falling behind makes a run invalid ------------------------------------


def check_dispatch_lag_invalidation(
    chat_requests: list[ChatRequest],
    server: RunningServer,
    *,
    block_s: float,
    allowed_ms: float,
    out_dir: Path,
    concurrency: int = 4,
    measured_requests: int = 40,
) -> dict:
    """Two arm-like runs, one with the client's event loop blocked, and their verdicts.

    Both run the real client with the real monitors' window against the zero-work
    server and are judged by `summarize_run`, as the arm runner does. In the blocked
    run the hook that opens the window first holds the event loop for `block_s`, as a
    client thread starved of CPU would: the next request leaves that much late.
    """
    verdicts = {}
    for blocked in (False, True):
        name = "blocked_client" if blocked else "unblocked_client"
        directory = out_dir / name
        directory.mkdir(parents=True, exist_ok=True)
        monitors = RunMonitors(server.process.pid, None, gpu=False)
        window: dict = {}

        def open_window(blocked: bool = blocked, monitors: RunMonitors = monitors):
            if blocked:
                time.sleep(block_s)  # the client's thread does something else
            monitors.start_window()

        try:
            monitors.discover()
            asyncio.run(
                run_load(
                    server.base_url,
                    chat_requests,
                    concurrency=concurrency,
                    measured_requests=measured_requests,
                    warmup_requests=concurrency,
                    output_tokens=OUTPUT_TOKENS,
                    model=ZERO_WORK_MODEL,
                    out_path=directory / "requests.jsonl",
                    progress=False,
                    on_measured_start=open_window,
                    on_measured_end=lambda w=window, m=monitors: w.update(
                        m.stop_window()
                    ),
                )
            )
        finally:
            monitors.stop()
        (directory / "monitors.json").write_text(json.dumps(window))
        arm = {"name": name, "requests": measured_requests, "cpu_quota": "none"}
        checks = {
            "quota_in_force_cores": None,
            "max_dispatch_lag_ms_allowed": allowed_ms,
            "warmup_requests": concurrency,
        }
        metrics = summarize_run(
            directory / "requests.jsonl", directory / "monitors.json", arm, checks, 1
        )
        verdicts[name] = {
            "valid": metrics["valid"],
            "invalid_reasons": metrics["invalid_reasons"],
            "dispatch_lag_max_ms": metrics["dispatch_lag_max_ms"],
        }
    blocked_verdict = verdicts["blocked_client"]
    return {
        "block_s": block_s,
        "max_dispatch_lag_ms_allowed": allowed_ms,
        **verdicts,
        "lagging_client_invalidates_run": (
            verdicts["unblocked_client"]["valid"]
            and not blocked_verdict["valid"]
            and any("dispatch lag" in r for r in blocked_verdict["invalid_reasons"])
        ),
    }


# --- Monitors: their CPU at default rates ------------------------------------------

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
        [sys.executable, "-c", MANY_THREADS_SERVER, str(threads)],
        dict(os.environ),
        None,
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


# --- Shared-memory copy against memcpy ---------------------------------------------


def measure_shm_copy(
    variants: dict[str, Path],
    rows: list[int],
    columns: int,
    repeats: int,
    niceness: int | None = None,
) -> dict:
    """Run `shm_copy_figures` in a fresh process with the server's default threads.

    The server strips every thread setting from its environment (Snakemake sets
    OMP_NUM_THREADS for its jobs), so torch there sizes its intra-op pool from the
    visible CPUs; the measuring process is started the same way.
    """
    command = [
        sys.executable,
        "-m",
        "serving_study.studies.harness_benchmarks",
        "shm-copy",
    ]
    if niceness is not None:
        command += ["--niceness", str(niceness)]
    command += ["--columns", str(columns), "--repeats", str(repeats), "--rows"]
    command += [str(count) for count in rows]
    for name, root in variants.items():
        command += ["--variant", f"{name}={root}"]
    before = read_cpu()
    finished = subprocess.run(
        command,
        env=server_environment(os.environ, {}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if finished.returncode != 0:
        raise RuntimeError(f"the shm-copy benchmark failed:\n{finished.stderr[-3000:]}")
    return {**json.loads(finished.stdout), **host_load_between(before, read_cpu())}


def shm_copy_figures(
    variants: dict[str, Path], rows: list[int], columns: int, repeats: int
) -> dict:
    """GB/s of each variant's ShmPointerMMData and of memcpy, per tensor size.

    One float32 tensor of (rows, columns) per size, as the image processor makes
    them. Per repeat, in turn: each variant's constructor plus the segment's
    unlink (the whole life of a segment in the sender); one memcpy into fresh
    anonymous memory (mmap, copy, munmap: page faults and zeroing included); one
    memcpy into a new /dev/shm segment (create, fallocate, copy, unlink: what the
    patched constructor does without torch); one memcpy into memory already
    faulted in (the bandwidth of the copy alone). Each copy's best round (its
    speed when nothing else on the host got in the way) and its median are given.
    The time this process took to import torch is reported too: every server
    process pays it at start-up.
    """
    import_started = time.perf_counter()
    import torch

    torch_import_s = time.perf_counter() - import_started

    from serving_study.engine.segments import unlink_segment
    from serving_study.engine.shm_loader import load_shm_pointer_class

    classes = {name: load_shm_pointer_class(root) for name, root in variants.items()}
    results = {}
    for row_count in rows:
        tensor = torch.rand(row_count, columns, dtype=torch.float32)
        nbytes = tensor.numel() * tensor.element_size()
        source_address = tensor.data_ptr()
        prefaulted = mmap.mmap(-1, nbytes)
        prefaulted_address = _address_of(prefaulted)
        ctypes.memset(prefaulted_address, 1, nbytes)

        def variant_copy(shm_pointer_class=None, tensor=tensor):
            unlink_segment(shm_pointer_class(tensor).shm_name)

        def fresh_memcpy(nbytes=nbytes, source_address=source_address):
            fresh = mmap.mmap(-1, nbytes)
            ctypes.memmove(_address_of(fresh), source_address, nbytes)
            fresh.close()

        def segment_memcpy(nbytes=nbytes, source_address=source_address):
            _memcpy_into_new_segment(source_address, nbytes)

        def prefaulted_memcpy(
            nbytes=nbytes, source_address=source_address, target=prefaulted_address
        ):
            ctypes.memmove(target, source_address, nbytes)

        copies: dict[str, Callable[[], None]] = {
            f"variant:{name}": (lambda c=cls: variant_copy(c))
            for name, cls in classes.items()
        }
        copies |= {
            "memcpy_fresh": fresh_memcpy,
            "memcpy_new_segment": segment_memcpy,
            "memcpy_prefaulted": prefaulted_memcpy,
        }
        seconds: dict[str, list[float]] = {name: [] for name in copies}
        names = list(copies)
        for repeat in range(repeats + 1):  # the first round warms up
            # A different order each round, so that no copy always follows another.
            shift = repeat % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.perf_counter()
                copies[name]()
                if repeat:
                    seconds[name].append(time.perf_counter() - started)
        prefaulted.close()

        results[str(row_count)] = {
            "shape": [row_count, columns],
            "bytes": nbytes,
            "gbps_best": {
                name: _gbps(nbytes, min(times)) for name, times in seconds.items()
            },
            "gbps_median": {
                name: _gbps(nbytes, statistics.median(times))
                for name, times in seconds.items()
            },
        }
    return {
        "pid": os.getpid(),
        "torch_threads": torch.get_num_threads(),
        "torch_import_s": round(torch_import_s, 3),
        "thread_settings_in_environment": {
            name: value for name, value in os.environ.items() if "THREADS" in name
        },
        "repeats": repeats,
        "sizes": results,
    }


def _gbps(nbytes: int, seconds: float) -> float | None:
    return round(nbytes / seconds / BYTES_PER_GB, 3) if seconds > 0 else None


def _address_of(buffer: mmap.mmap) -> int:
    """The address of a mapping's first byte (the view is released at once)."""
    view = (ctypes.c_char * len(buffer)).from_buffer(buffer)
    try:
        return ctypes.addressof(view)
    finally:
        del view


def _memcpy_into_new_segment(source_address: int, nbytes: int) -> None:
    from multiprocessing import shared_memory

    name = f"{MEMCPY_SEGMENT_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
    segment = shared_memory.SharedMemory(create=True, size=nbytes, name=name)
    try:
        os.posix_fallocate(segment._fd, 0, nbytes)
        target = (ctypes.c_char * nbytes).from_buffer(segment.buf)
        ctypes.memmove(ctypes.addressof(target), source_address, nbytes)
        del target
    finally:
        segment.close()
        segment.unlink()


def summarize_shm_copy(figures: dict, image_sizes: dict[str, int]) -> dict:
    """`shm_copy_gbps` per variant and image size beside `memcpy_gbps`, and ratios.

    Best rounds are compared: on a shared host they are the closest to what the
    copy itself costs. The reference is memcpy into fresh memory: every
    ShmPointerMMData copies into a segment created for it, whose pages the kernel
    must allocate and zero first; memcpy into memory already faulted in is the
    bandwidth of the copy alone, which no new segment can reach.
    """
    shm_copy_gbps: dict[str, dict[str, float]] = {}
    memcpy_gbps: dict[str, dict[str, float]] = {}
    for image_size, row_count in image_sizes.items():
        size = figures["sizes"][str(row_count)]
        for name, gbps in size["gbps_best"].items():
            if name.startswith("variant:"):
                variant = name.removeprefix("variant:")
                shm_copy_gbps.setdefault(variant, {})[image_size] = gbps
            else:
                kind = name.removeprefix("memcpy_")
                memcpy_gbps.setdefault(kind, {})[image_size] = gbps
    ratios = {
        variant: {
            image_size: round(gbps / memcpy_gbps["fresh"][image_size], 3)
            for image_size, gbps in by_size.items()
        }
        for variant, by_size in shm_copy_gbps.items()
    }
    patched = ratios.get("patched", {})
    return {
        "shm_copy_gbps": shm_copy_gbps,
        "memcpy_gbps": memcpy_gbps,
        "shm_copy_to_memcpy_fresh_ratio": ratios,
        "shm_copy_patched_to_memcpy_ratio": min(patched.values()) if patched else None,
        "torch_threads": figures["torch_threads"],
        "torch_import_s": figures["torch_import_s"],
        "host_busy_cores": figures.get("host_busy_cores"),
        "rows_per_image_size": image_sizes,
        "raw": figures,
    }


# --- One real arm: its wall time beyond the measured window ------------------------

SERVER_LOG_LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \w+ [\w.]+: (.*)$"
)
# What the embedded engine logs at each step of its life, by the step's name.
SERVER_MILESTONES = {
    "main_process_ready": "loaded ShmPointerMMData",
    "scheduler_started": "scheduler process started",
    "scheduler_ready": "scheduler ready",
    "healthy": "The server is fired up",
    "stop_requested": "stop requested",
    "engine_stopped": "engine stopped",
}


def server_milestones(server_log: Path) -> dict[str, float]:
    """Epoch seconds of each milestone line in an embedded engine's log."""
    found = {}
    for line in server_log.read_text(errors="replace").splitlines():
        match = SERVER_LOG_LINE.match(line)
        if not match:
            continue
        moment, message = match.groups()
        for name, prefix in SERVER_MILESTONES.items():
            if name not in found and message.startswith(prefix):
                stamp = datetime.strptime(moment, "%Y-%m-%d %H:%M:%S,%f")
                found[name] = stamp.timestamp()
    return found


def arm_phases(
    milestones: dict[str, float], client: dict, launched: float, returned: float
) -> dict[str, float | None]:
    """Seconds spent in each phase of one arm, from launch to the runner's return."""
    t0 = client["t0_epoch"]
    moments = {
        "launched": launched,
        **milestones,
        "client_started": t0,
        "measured_started": t0 + client["measured_start_s"],
        "measured_ended": t0 + client["measured_end_s"],
        "client_ended": t0 + client["wall_seconds"],
        "runner_returned": returned,
    }
    phases = {
        "launch_to_healthy": ("launched", "healthy"),
        "main_process_start": ("launched", "main_process_ready"),
        "scheduler_start": ("scheduler_started", "scheduler_ready"),
        "server_warmup_request": ("scheduler_ready", "healthy"),
        "healthy_to_client_start": ("healthy", "client_started"),
        "client_warmup": ("client_started", "measured_started"),
        "measured_window": ("measured_started", "measured_ended"),
        "after_measured": ("measured_ended", "client_ended"),
        "teardown": ("client_ended", "runner_returned"),
        "server_shutdown": ("stop_requested", "engine_stopped"),
    }
    return {
        name: (
            round(moments[end] - moments[start], 3)
            if moments.get(start) is not None and moments.get(end) is not None
            else None
        )
        for name, (start, end) in phases.items()
    }


def overhead_split(overhead: float | None, phases: dict | None) -> dict | None:
    """An arm's overhead as the server's start, the method's warm-up, and the rest.

    The server's start is launch to healthy: the main process's and the spawned
    scheduler's Python and torch start-up and the server's own warm-up request.
    The client's warm-up at the arm's quota is part of the method. What remains is
    the harness: noticing health, reading the workload, the monitors, teardown.
    """
    if overhead is None or not phases:
        return None
    server_start = phases.get("launch_to_healthy")
    warmup = phases.get("client_warmup")
    if server_start is None or warmup is None:
        return None
    return {
        "server_start": server_start,
        "client_warmup": warmup,
        "harness": round(overhead - server_start - warmup, 3),
    }


def measure_arm_overhead(
    *,
    arm: dict,
    variant: dict,
    workload_manifest: Path,
    engine: dict,
    client: dict,
    monitors: dict,
    out_dir: Path,
) -> dict:
    """Run one real arm; split its wall time into the measured window and the rest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = RunPaths.in_directory(out_dir)
    before = read_cpu()
    launched = time.time()
    metrics = run_arm(
        experiment="harness-benchmark",
        arm=arm,
        run=1,
        variant=variant,
        workload_manifest=workload_manifest,
        engine=engine,
        client=client,
        monitors=monitors,
        paths=paths,
    )
    returned = time.time()
    after = read_cpu()
    provenance = json.loads(paths.provenance.read_text())
    wall, measured = provenance["wall_s"], metrics["measured_seconds"]
    overhead = wall - measured if measured else None
    client_summary = provenance.get("client")
    phases = (
        arm_phases(
            server_milestones(paths.server_log), client_summary, launched, returned
        )
        if client_summary
        else None
    )
    return {
        "arm_overhead_s": round(overhead, 3) if overhead is not None else None,
        "overhead_split_s": overhead_split(overhead, phases),
        "arm_wall_s": wall,
        "measured_seconds": measured,
        "arm": arm["name"],
        "variant": variant["name"],
        "cpu_quota": arm["cpu_quota"],
        "quota_during_startup": client.get("quota_during_startup"),
        "valid": metrics["valid"],
        "invalid_reasons": metrics["invalid_reasons"],
        "throughput_rps": metrics["throughput_rps"],
        "dispatch_lag_max_ms": metrics["dispatch_lag_max_ms"],
        "max_dispatch_lag_ms_allowed": client["max_dispatch_lag_ms"],
        "phases_s": phases,
        **host_load_between(before, after),
    }


# --- The default study's wall time, from Snakemake's records ------------------------


def snakemake_records(metadata_dir: Path, outputs: list[str]) -> dict[str, dict]:
    """Snakemake's record of each listed output that has one (.snakemake/metadata).

    Snakemake keeps one record per output file, named by the urlsafe base64 of the
    path (split into `@`-prefixed directories when longer than a file name may be).
    """
    wanted = set(outputs)
    records = {}
    for record_path in Path(metadata_dir).rglob("*"):
        if not record_path.is_file():
            continue
        parts = record_path.relative_to(metadata_dir).parts
        encoded = "".join(part.removeprefix("@") for part in parts)
        try:
            output = base64.urlsafe_b64decode(encoded).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        if output not in wanted:
            continue
        try:
            record = json.loads(record_path.read_text())
        except (ValueError, OSError):
            continue
        if record.get("starttime") is not None and record.get("endtime") is not None:
            records[output] = record
    return records


def jobs_of(records: dict[str, dict]) -> list[dict]:
    """One entry per job (the outputs of one job share its rule and log), by start."""
    jobs: dict[tuple, dict] = {}
    for output, record in records.items():
        key = (record.get("rule"), tuple(record.get("log") or [output]))
        job = jobs.setdefault(
            key, {"rule": record.get("rule"), "start": record["starttime"], "end": 0}
        )
        job["start"] = min(job["start"], record["starttime"])
        job["end"] = max(job["end"], record["endtime"])
    return sorted(jobs.values(), key=lambda job: job["start"])


def default_study_wall(
    metadata_dir: Path, study_outputs: list[str], max_gap_s: float = 30.0
) -> dict:
    """The default study's wall time on this host, from the last run of each job.

    `study_outputs` names one output of every job of the study. With `--cores 1`
    the jobs run one after another, so the study costs the sum of its jobs'
    durations (Snakemake's own start-up of a few seconds aside). The span of the
    last uninterrupted stretch of jobs tells whether they all ran in one go.
    """
    if not Path(metadata_dir).is_dir():
        return {
            "default_study_wall_s": None,
            "reason": f"no {metadata_dir}: the default study never ran here",
        }
    records = snakemake_records(metadata_dir, study_outputs)
    missing = sorted(set(study_outputs) - set(records))
    if missing:
        return {
            "default_study_wall_s": None,
            "reason": f"{len(missing)} outputs of the default study have no record "
            f"in {metadata_dir} (first: {missing[0]}): run `snakemake --cores 1 all`",
        }
    jobs = jobs_of(records)
    stretch = [jobs[0]]
    for job in jobs[1:]:
        if job["start"] - max(j["end"] for j in stretch) > max_gap_s:
            stretch = []
        stretch.append(job)
    by_rule: dict[str, float] = {}
    for job in jobs:
        by_rule[job["rule"]] = by_rule.get(job["rule"], 0.0) + job["end"] - job["start"]
    return {
        "default_study_wall_s": round(sum(j["end"] - j["start"] for j in jobs), 1),
        "jobs": len(jobs),
        "seconds_by_rule": {rule: round(s, 1) for rule, s in sorted(by_rule.items())},
        "last_stretch_span_s": round(
            max(j["end"] for j in stretch) - stretch[0]["start"], 1
        ),
        "last_stretch_jobs": len(stretch),
        "first_job_started": _iso(jobs[0]["start"]),
        "last_job_ended": _iso(max(job["end"] for job in jobs)),
        "source": str(metadata_dir),
    }


def with_current_arm_overhead(
    study: dict, run_directories: list[Path], arm_overhead_s: float | None
) -> dict:
    """The recorded study's wall time if its runs had today's arm overhead.

    Each recorded run's overhead is its `provenance.json` wall time minus its
    measured window (`metrics.json`); the estimate swaps them for the overhead
    just measured, keeping every measured window and every other job as recorded.
    """
    overheads = []
    for directory in run_directories:
        try:
            wall = json.loads((directory / "provenance.json").read_text())["wall_s"]
            measured = json.loads((directory / "metrics.json").read_text())
        except (OSError, ValueError, KeyError):
            continue
        if measured.get("measured_seconds"):
            overheads.append(wall - measured["measured_seconds"])
    if study.get("default_study_wall_s") is None or not overheads or not arm_overhead_s:
        return study
    estimate = study["default_study_wall_s"] - sum(overheads)
    estimate += len(overheads) * arm_overhead_s
    return {
        **study,
        "recorded_arm_overhead_s_median": round(statistics.median(overheads), 3),
        "recorded_runs": len(overheads),
        "estimated_wall_s_with_measured_arm_overhead": round(estimate, 1),
    }


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


# --- Everything, in one run ---------------------------------------------------------


def goals_met(figures: dict) -> dict:
    """Each goal of the harness with its figure and whether it holds."""
    verdicts = {}
    for name, (direction, bound) in GOALS.items():
        value = figures.get(name)
        met = None
        if value is not None:
            met = value >= bound if direction == ">=" else value <= bound
        verdicts[name] = {"value": value, "goal": f"{direction} {bound:g}", "met": met}
    return verdicts


def run_benchmarks(settings: dict, out_dir: Path) -> dict:
    """Every section, one after another, and the figures the issue asks for on top.

    `settings` holds the inputs (workload manifest, variant identities, the arm and
    the engine, client and monitor settings) and every size and duration used.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    client_cpu, server_cpu = client_and_server_cpus()
    started = time.monotonic()
    report: dict = {"host": describe_benchmark_host(client_cpu, server_cpu)}
    chat_requests = load_requests(Path(settings["workload_manifest"]))

    with (
        raised_priority() as raised,
        zero_work_server(server_cpu, niceness=BENCHMARK_NICENESS) as server,
    ):
        report["host"]["client_and_zero_work_server_niceness"] = (
            BENCHMARK_NICENESS if raised else os.getpriority(os.PRIO_PROCESS, 0)
        )
        log.info("client rate against the zero-work server")
        report["client_rate"] = measure_client_rate(
            chat_requests,
            server,
            client_cpu=client_cpu,
            concurrencies=settings["client_concurrencies"],
            measured_requests=settings["client_measured_requests"],
            study_peak_rps=settings["study_peak_rps"],
            out_dir=out_dir,
        )
        log.info("client TTFT overhead against a raw socket")
        report["client_ttft"] = measure_ttft_overhead(
            chat_requests,
            server,
            client_cpu=client_cpu,
            requests_per_round=settings["ttft_requests_per_round"],
            rounds=settings["ttft_rounds"],
            out_dir=out_dir,
        )
        log.info("a lagging client's run")
        report["dispatch_lag"] = check_dispatch_lag_invalidation(
            chat_requests,
            server,
            block_s=settings["dispatch_block_s"],
            allowed_ms=settings["client"]["max_dispatch_lag_ms"],
            out_dir=out_dir / "dispatch-lag",
        )
    log.info("monitors' CPU over %s s", settings["monitor_window_s"])
    report["monitors"] = measure_monitor_cpu(
        window_s=settings["monitor_window_s"],
        threads=settings["monitor_tree_threads"],
        sample_hz=settings["monitors"]["sample_hz"],
        thread_sample_hz=settings["monitors"]["thread_sample_hz"],
        group_name=f"harness-benchmark-monitors-{os.getpid()}",
        log_path=out_dir / "monitor-tree.log",
    )
    log.info("shared-memory copies beside memcpy")
    report["shm_copy"] = summarize_shm_copy(
        measure_shm_copy(
            {name: Path(root) for name, root in settings["variant_roots"].items()},
            sorted(set(settings["shm_rows_per_image_size"].values())),
            settings["shm_columns"],
            settings["shm_repeats"],
            niceness=BENCHMARK_NICENESS,
        ),
        settings["shm_rows_per_image_size"],
    )
    log.info("one real arm")
    report["arm"] = measure_arm_overhead(
        arm=settings["arm"],
        variant=settings["arm_variant"],
        workload_manifest=Path(settings["workload_manifest"]),
        engine=settings["engine"],
        client=settings["client"],
        monitors=settings["monitors"],
        out_dir=out_dir / "arm",
    )
    report["default_study"] = with_current_arm_overhead(
        default_study_wall(
            Path(settings["snakemake_metadata"]), settings["study_outputs"]
        ),
        [Path(directory) for directory in settings["study_run_directories"]],
        report["arm"]["arm_overhead_s"],
    )
    report["host"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["benchmark_wall_s"] = round(time.monotonic() - started, 1)

    figures = {
        "client_max_rps": report["client_rate"]["client_max_rps"],
        "client_headroom_ratio": report["client_rate"]["client_headroom_ratio"],
        "client_ttft_overhead_ms_p50": report["client_ttft"][
            "client_ttft_overhead_ms_p50"
        ],
        "monitor_cpu_fraction": report["monitors"]["monitor_cpu_fraction"],
        "arm_overhead_s": report["arm"]["arm_overhead_s"],
        "default_study_wall_s": report["default_study"]["default_study_wall_s"],
        "shm_copy_gbps": report["shm_copy"]["shm_copy_gbps"],
        "memcpy_gbps": report["shm_copy"]["memcpy_gbps"],
        "shm_copy_patched_to_memcpy_ratio": report["shm_copy"][
            "shm_copy_patched_to_memcpy_ratio"
        ],
        "lagging_client_invalidates_run": report["dispatch_lag"][
            "lagging_client_invalidates_run"
        ],
    }
    return {**figures, "goals": goals_met(figures), **report}


# --- Command line: the parts that need a fresh process -------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serving_study.studies.harness_benchmarks"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    shm = commands.add_parser(
        "shm-copy", help="time each variant's ShmPointerMMData and memcpy; print JSON"
    )
    shm.add_argument("--variant", action="append", required=True, help="NAME=ROOT")
    shm.add_argument("--rows", type=int, nargs="+", required=True)
    shm.add_argument("--columns", type=int, default=1536)
    shm.add_argument("--repeats", type=int, default=10)
    shm.add_argument("--niceness", type=int, help="run at this niceness if allowed")
    arguments = parser.parse_args(argv)
    if arguments.niceness is not None:
        # Threads started later (torch's OpenMP pool) inherit it.
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, 0, arguments.niceness)
    variants = dict(item.split("=", 1) for item in arguments.variant)
    figures = shm_copy_figures(
        {name: Path(root) for name, root in variants.items()},
        arguments.rows,
        arguments.columns,
        arguments.repeats,
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
