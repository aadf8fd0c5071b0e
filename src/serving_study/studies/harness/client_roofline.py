"""The load client's own limits, against a server that does no work.

Its highest sustained request rate, pinned to one CPU, and the time it adds to a
request's first token beside the least a client can do: one blocking socket.
"""

import asyncio
import re
import socket
import statistics
import time
from pathlib import Path

import psutil

from serving_study.measure import http1
from serving_study.measure.chat_requests import JSON, ChatRequest
from serving_study.measure.client import run_load
from serving_study.measure.request_log import read_request_log
from serving_study.measure.run_metrics import percentile
from serving_study.studies.harness.benchmark_host import (
    host_load_between,
    pinned_to,
    read_cpu,
)
from serving_study.studies.harness.zero_work import OUTPUT_TOKENS, RunningServer
from serving_study.studies.zero_work_server import MODEL as ZERO_WORK_MODEL


def measure_client_rate(
    chat_requests: list[ChatRequest],
    server: RunningServer,
    *,
    client_cpu: int,
    concurrencies: list[int],
    measured_requests: int,
    study_peak_rps: float,
    request_timeout_s: float,
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
                    request_timeout_s=request_timeout_s,
                )
            )
            after = read_cpu([client, server.process])
        wall = after.at - before.at
        window = (summary.measured_end_s or 0) - (summary.measured_start_s or 0)
        sent = 2 * concurrency + measured_requests  # warm-up and measured requests
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
                    1000 * summary.client_cpu_seconds / sent, 4
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
    request_timeout_s: float,
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
    raw, harness, per_round = [], [], []  # TTFTs in ms, and overheads per round
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
                    request_timeout_s=request_timeout_s,
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
