"""The load client: streaming chat requests with one image each, in a closed or
an open loop.

`run_load` turns the workload's requests (chat_requests.py) into complete request
bodies before the clock starts, then sends them as streaming requests
(chat_stream.py): warm-up requests first, then the measured ones, with no pause
between them so the server stays at the same load. In a closed loop (the default)
exactly `concurrency` are in flight; in an open loop each is sent at its arrival
time (arrivals.py), or, when `concurrency` requests are in flight then, as soon as
one of them ends. Requests go over kept-alive HTTP/1.1 connections, one per slot
(`http1.py`).

Per request it writes one JSON line:
    index, phase ("warmup"|"measured"), image_file,
    arrival_s         its arrival time in an open loop (null in a closed loop)
    scheduled_s, sent_s, first_token_s, end_s   seconds since the summary's t0
    dispatch_lag_ms   sent minus scheduled (the client falling behind)
    ttft_ms, e2e_ms   from sent_s to the first non-empty token / the end
    itl_ms            the gaps between consecutive chunks that carry tokens
    output_tokens     from the stream's usage chunk, else counted token chunks
    status, error     HTTP status (null if none came) and what went wrong (or null)

In a closed loop a request is scheduled when the one before it in its slot ends; in
an open loop at its arrival, or when a slot frees if none was free then (the wait
for a slot, scheduled minus arrival, is the server's backlog and not the client's).
Either way dispatch lag measures how long the client's event loop took to send it.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from serving_study.measure import http1
from serving_study.measure.arrivals import ArrivalSchedule
from serving_study.measure.chat_requests import JSON, ChatRequest
from serving_study.measure.chat_stream import StreamOutcome, stream_chat
from serving_study.measure.progress import ProgressLine, progress_terminal

LOOP_LAG_TICK_S = 0.02
PROGRESS_EVERY_S = 0.5


@dataclass
class LoadSummary:
    """What the client did as a whole; request times are seconds since t0."""

    t0_monotonic: float
    t0_epoch: float
    concurrency: int
    arrivals: dict | None  # an open loop's schedule (ArrivalSchedule.record)
    warmup_requests: int
    measured_requests: int
    measured_start_s: float | None  # first measured send
    measured_end_s: float | None  # last measured end
    measured_ok: int
    measured_errors: int
    warmup_ok: int
    warmup_errors: int
    max_dispatch_lag_ms: float | None
    max_loop_lag_ms: float  # worst oversleep of a 20 ms ticker: event-loop saturation
    client_cpu_seconds: float  # this process's CPU during the run
    wall_seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Progress:
    total: int
    done: int = 0
    errors: int = 0
    in_flight: int = 0
    max_loop_lag: float = 0.0


async def run_load(
    base_url: str,
    requests: list[ChatRequest],
    *,
    concurrency: int,
    measured_requests: int,
    warmup_requests: int,
    output_tokens: int,
    model: str,
    out_path: Path,
    progress: bool,
    request_timeout_s: float,
    arrivals: ArrivalSchedule | None = None,
    on_measured_start: Callable[[], None] | None = None,
    on_measured_end: Callable[[], None] | None = None,
) -> LoadSummary:
    """Run warm-up then measured requests, `concurrency` in flight (at most, with
    `arrivals`: an open loop); log to out_path.

    Request i uses requests[i % len(requests)]; warm-up requests take the first
    indices, and arrival times, when given, are one per request in that order.
    `progress` draws a line on the user's terminal, if any (progress.py).
    `request_timeout_s` bounds one request from send to its last byte (it
    exists to end a hung run, not to cut slow tails). `on_measured_start` is called
    on the event loop just before the first measured request is sent and
    `on_measured_end` after the last one ends (e.g. to open and close the monitors'
    window); both must return quickly.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}.")
    if not requests:
        raise ValueError("No requests to send: the workload is empty.")
    total = warmup_requests + measured_requests
    if arrivals is not None and len(arrivals.times_s) != total:
        raise ValueError(
            f"{len(arrivals.times_s)} arrival times for {total} requests: one each."
        )
    endpoint = http1.Endpoint.from_url(base_url.rstrip("/") + "/v1/chat/completions")
    bodies = [r.body(model=model, output_tokens=output_tokens) for r in requests]
    prepared = [http1.prepare_post(endpoint, body, JSON) for body in bodies]
    records: list[dict | None] = [None] * total
    state = _Progress(total=total)

    connections = http1.Connections(endpoint)
    free_slots = asyncio.Semaphore(concurrency)
    terminal = progress_terminal() if progress else None
    line = ProgressLine(total, warmup_requests, terminal)
    cpu_started = time.process_time()
    t0 = time.monotonic()
    t0_epoch = time.time()
    slot_freed_at = collections.deque([t0] * concurrency)

    def since_t0(moment: float | None) -> float | None:
        return None if moment is None else round(moment - t0, 6)

    def arrival_at(index: int) -> float | None:
        return None if arrivals is None else t0 + arrivals.times_s[index]

    async def one_request(index: int, scheduled_at: float) -> None:
        state.in_flight += 1
        sent_at = time.monotonic()
        outcome = StreamOutcome()
        try:
            async with asyncio.timeout(request_timeout_s):
                await stream_chat(connections, prepared[index % len(prepared)], outcome)
        except Exception as error:  # recorded per request: connection, payload, JSON
            outcome.error = f"{type(error).__name__}: {error}"[:300]
        ended_at = time.monotonic()
        records[index] = {
            "index": index,
            "phase": "warmup" if index < warmup_requests else "measured",
            "image_file": requests[index % len(requests)].image_file,
            "arrival_s": since_t0(arrival_at(index)),
            "scheduled_s": since_t0(scheduled_at),
            "sent_s": since_t0(sent_at),
            "first_token_s": since_t0(outcome.first_token_at),
            "end_s": since_t0(ended_at),
            "dispatch_lag_ms": _milliseconds(sent_at, scheduled_at),
            "ttft_ms": _milliseconds(outcome.first_token_at, sent_at),
            "e2e_ms": _milliseconds(ended_at, sent_at),
            "itl_ms": [
                _milliseconds(later, earlier)
                for earlier, later in itertools.pairwise(outcome.token_chunk_times)
            ],
            "output_tokens": outcome.output_tokens,
            "status": outcome.status,
            "error": outcome.error,
        }
        state.in_flight -= 1
        state.done += 1
        if outcome.error is not None:
            state.errors += 1
        slot_freed_at.append(ended_at)
        free_slots.release()

    async def watch_loop() -> None:
        """Measure event-loop lag and draw the progress line."""
        last_drawn = time.monotonic()
        while True:
            due = time.monotonic() + LOOP_LAG_TICK_S
            await asyncio.sleep(LOOP_LAG_TICK_S)
            now = time.monotonic()
            state.max_loop_lag = max(state.max_loop_lag, now - due)
            if now - last_drawn >= PROGRESS_EVERY_S:
                line.show(state.done, state.errors, state.in_flight)
                last_drawn = now

    watcher = asyncio.create_task(watch_loop())
    tasks: set[asyncio.Task] = set()
    try:
        for index in range(total):
            arrival = arrival_at(index)
            if arrival is not None:
                await asyncio.sleep(arrival - time.monotonic())
            await free_slots.acquire()
            if index == warmup_requests and on_measured_start is not None:
                on_measured_start()
            # Due when its slot freed, and in an open loop not before it arrived.
            scheduled_at = slot_freed_at.popleft()
            if arrival is not None:
                scheduled_at = max(scheduled_at, arrival)
            task = asyncio.create_task(one_request(index, scheduled_at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*tasks)
        if measured_requests and on_measured_end is not None:
            on_measured_end()
    finally:
        watcher.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(watcher, *tasks, return_exceptions=True)
        connections.close()
        _write_records(out_path, records)
        line.close()

    return LoadSummary(
        t0_monotonic=t0,
        t0_epoch=t0_epoch,
        concurrency=concurrency,
        arrivals=None if arrivals is None else arrivals.record(),
        warmup_requests=warmup_requests,
        measured_requests=measured_requests,
        **_outcomes([record for record in records if record is not None]),
        max_loop_lag_ms=round(state.max_loop_lag * 1000, 3),
        client_cpu_seconds=time.process_time() - cpu_started,
        wall_seconds=time.monotonic() - t0,
    )


def _milliseconds(later: float | None, earlier: float) -> float | None:
    return None if later is None else round((later - earlier) * 1000, 3)


def _write_records(out_path: Path, records: list[dict | None]) -> None:
    """Write the requests that ran, in index order, one JSON object per line."""
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(record) + "\n" for record in records if record is not None]
    Path(out_path).write_text("".join(lines), encoding="utf-8")


def _outcomes(ran: list[dict]) -> dict:
    """The summary's figures of the requests that ran: the measured ones' first
    send and last end, the outcomes of each phase, and the worst dispatch lag."""
    measured = [record for record in ran if record["phase"] == "measured"]
    warmup = [record for record in ran if record["phase"] == "warmup"]
    return {
        "measured_start_s": min((r["sent_s"] for r in measured), default=None),
        "measured_end_s": max((r["end_s"] for r in measured), default=None),
        "measured_ok": sum(1 for r in measured if r["error"] is None),
        "measured_errors": sum(1 for r in measured if r["error"] is not None),
        "warmup_ok": sum(1 for r in warmup if r["error"] is None),
        "warmup_errors": sum(1 for r in warmup if r["error"] is not None),
        "max_dispatch_lag_ms": max((r["dispatch_lag_ms"] for r in ran), default=None),
    }
