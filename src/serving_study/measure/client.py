"""The load client: closed-loop streaming chat requests with one image each.

The workload manifest (JSON, written by `workloads.py`) names a prompt and a list of
images relative to the manifest's directory. `load_requests` reads and checks every
image and pre-encodes its chat message (base64 data URL) once; `run_load` turns them
into complete request bodies before the clock starts, then keeps exactly
`concurrency` streaming requests in flight: warm-up requests first, then the measured
ones, with no pause between them so the server stays at the same load. Requests go
over kept-alive HTTP/1.1 connections, one per slot (`http1.py`).

Per request it writes one JSON line:
    index, phase ("warmup"|"measured"), image_file,
    scheduled_s, sent_s, first_token_s, end_s   seconds since the summary's t0
    dispatch_lag_ms   sent minus scheduled (the client falling behind)
    ttft_ms, e2e_ms   from sent_s to the first non-empty token / the end
    output_tokens     from the stream's usage chunk, else counted token chunks
    status, error     HTTP status (null if none came) and what went wrong (or null)

In a closed loop a request is scheduled when the one before it in its slot ends, so
dispatch lag measures how long the client's event loop took to send the next one.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import requests

from serving_study.measure import http1

IMAGE_MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "jpg": "image/jpeg"}
LOOP_LAG_TICK_S = 0.02
PROGRESS_EVERY_S = 0.5
STREAM_END_WAIT_S = 1.0  # after [DONE], for the body's end
JSON = "application/json"


class ServerNeverHealthy(RuntimeError):
    """The server did not answer GET /health with 200 in time."""


@dataclass(frozen=True)
class ChatRequest:
    """One image and the prompt, with its chat message already JSON-encoded."""

    image_file: str  # as named in the manifest, relative to the manifest's directory
    messages_json: bytes  # the encoded value of the body's "messages" field

    def body(self, *, model: str, output_tokens: int) -> bytes:
        """The complete JSON body of a streaming chat-completions request."""
        settings = {
            "model": model,
            "max_completion_tokens": output_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        head = json.dumps(settings, separators=(",", ":")).encode()
        # Splice the encoded messages in: re-encoding megabytes of base64 is slow.
        return head[:-1] + b',"messages":' + self.messages_json + b"}"


def load_requests(manifest_path: Path) -> list[ChatRequest]:
    """One ChatRequest per manifest image, in manifest order; checks every sha256."""
    manifest_path = Path(manifest_path)
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    prompt = manifest["prompt"]
    if not manifest.get("images"):
        raise ValueError(f"Workload manifest {manifest_path} lists no images.")
    chat_requests = []
    for image in manifest["images"]:
        path = manifest_path.parent / image["file"]
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != image["sha256"]:
            raise ValueError(
                f"Image {path} has sha256 {digest}, the manifest says "
                f"{image['sha256']}: the workload changed after it was written. "
                "Regenerate the workload."
            )
        media_type = IMAGE_MEDIA_TYPES.get(image["format"])
        if media_type is None:
            raise ValueError(
                f"Image {path} has format {image['format']!r}; the client sends "
                f"{sorted(IMAGE_MEDIA_TYPES)}."
            )
        url = f"data:{media_type};base64,".encode() + base64.b64encode(data)
        chat_requests.append(
            ChatRequest(
                image_file=image["file"], messages_json=messages_json(url, prompt)
            )
        )
    return chat_requests


def messages_json(image_url: bytes, prompt: str) -> bytes:
    """The JSON of one user message with an image URL and the prompt.

    A data URL needs no escaping in JSON (base64 and its prefix are plain ASCII),
    so it is spliced in as bytes: JSON-encoding megabytes of base64 would scan every
    character, which took most of the time of loading a workload.
    """
    placeholder = "\0image-url\0"
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": placeholder}},
                {"type": "text", "text": prompt},
            ],
        }
    ]
    head, tail = json.dumps(messages, separators=(",", ":")).split(
        json.dumps(placeholder)
    )
    return b'%s"%s"%s' % (head.encode(), image_url, tail.encode())


@dataclass
class LoadSummary:
    """What the client did as a whole; request times are seconds since t0."""

    t0_monotonic: float
    t0_epoch: float
    concurrency: int
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


# --- One streaming request ------------------------------------------------------------


@dataclass
class _Outcome:
    status: int | None = None
    error: str | None = None
    first_token_at: float | None = None
    output_tokens: int | None = None


async def _stream_chat(
    connections: http1.Connections, request: bytes, outcome: _Outcome
) -> None:
    """Send one prepared request and read its SSE stream to [DONE], filling `outcome`.

    Only the events up to the first token are decoded on the way; later ones are
    kept as bytes and decoded at [DONE] only as far as needed (usage normally sits
    in the last one), which keeps the client's CPU per request low.
    """
    response = await http1.send(connections, request)
    try:
        outcome.status = response.status
        if response.status != 200:
            text = (await response.read_all()).decode(errors="replace")
            outcome.error = f"HTTP {response.status}: {text[:300]}"
            return
        after_first_token: list[bytes] = []
        pending = b""
        async for data in response.body():
            pending += data
            if b"\r" in pending:
                pending = pending.replace(b"\r\n", b"\n")
            *events, pending = pending.split(b"\n\n")
            for event in events:
                payload = _event_data(event)
                if payload is None:
                    continue
                if payload == b"[DONE]":
                    _finish(outcome, after_first_token)
                    # The body's end follows; read it so the connection is reused.
                    await response.finish(STREAM_END_WAIT_S)
                    return
                if outcome.first_token_at is not None and b'"error"' not in payload:
                    after_first_token.append(payload)
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    outcome.error = f"error event in stream: {chunk['error']}"[:300]
                    return
                if outcome.first_token_at is None and _has_token(chunk):
                    outcome.first_token_at = time.monotonic()
                    after_first_token.append(payload)
        outcome.error = "stream ended before [DONE]"
    finally:
        await connections.release(response)


def _finish(outcome: _Outcome, after_first_token: list[bytes]) -> None:
    """Output tokens from the stream's usage chunk, else by counting token chunks."""
    for payload in reversed(after_first_token[-2:]):
        usage = json.loads(payload).get("usage")
        if usage and usage.get("completion_tokens") is not None:
            outcome.output_tokens = usage["completion_tokens"]
            return
    outcome.output_tokens = sum(
        1 for payload in after_first_token if _has_token(json.loads(payload))
    )


def _event_data(event: bytes) -> bytes | None:
    """The data of one SSE event (its `data:` lines joined), or None if it has none."""
    if event.startswith(b"data: ") and b"\n" not in event:
        return event[6:].strip()  # the usual one-line event
    lines = [
        line[5:].lstrip(b" ")
        for line in event.split(b"\n")
        if line.startswith(b"data:")
    ]
    return b"\n".join(lines).strip() if lines else None


def _has_token(chunk: dict) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content"):
            return True
    return False


# --- The closed loop ------------------------------------------------------------------


@dataclass
class _Progress:
    total: int
    done: int = 0
    ok: int = 0
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
    request_timeout_s: float = 3600.0,
    on_measured_start: Callable[[], None] | None = None,
    on_measured_end: Callable[[], None] | None = None,
) -> LoadSummary:
    """Run warm-up then measured requests, `concurrency` in flight; log to out_path.

    Request i uses requests[i % len(requests)]; warm-up requests take the first
    indices. `request_timeout_s` bounds one request from send to its last byte (it
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
    endpoint = http1.Endpoint.from_url(base_url.rstrip("/") + "/v1/chat/completions")
    prepared = [
        http1.prepare_post(
            endpoint, r.body(model=model, output_tokens=output_tokens), JSON
        )
        for r in requests
    ]
    records: list[dict | None] = [None] * total
    state = _Progress(total=total)

    connections = http1.Connections(endpoint)
    free_slots = asyncio.Semaphore(concurrency)
    slot_freed_at: collections.deque[float] = collections.deque()
    show_progress = progress and sys.stderr.isatty()
    cpu_started = time.process_time()
    t0 = time.monotonic()
    t0_epoch = time.time()
    slot_freed_at.extend([t0] * concurrency)

    async def one_request(index: int, scheduled_at: float) -> None:
        state.in_flight += 1
        sent_at = time.monotonic()
        outcome = _Outcome()
        try:
            async with asyncio.timeout(request_timeout_s):
                await _stream_chat(
                    connections, prepared[index % len(prepared)], outcome
                )
        except Exception as error:  # recorded per request: connection, payload, JSON
            outcome.error = f"{type(error).__name__}: {error}"[:300]
        ended_at = time.monotonic()
        records[index] = _record(
            index,
            "warmup" if index < warmup_requests else "measured",
            requests[index % len(requests)].image_file,
            t0,
            scheduled_at,
            sent_at,
            ended_at,
            outcome,
        )
        state.in_flight -= 1
        state.done += 1
        if outcome.error is None:
            state.ok += 1
        else:
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
            if show_progress and now - last_drawn >= PROGRESS_EVERY_S:
                _draw_progress(state, warmup_requests)
                last_drawn = now

    watcher = asyncio.create_task(watch_loop())
    tasks: set[asyncio.Task] = set()
    try:
        for index in range(total):
            await free_slots.acquire()
            if index == warmup_requests and on_measured_start is not None:
                on_measured_start()
            scheduled_at = slot_freed_at.popleft()
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
        if show_progress:
            _draw_progress(state, warmup_requests)
            print(file=sys.stderr)

    return _summary(
        records,
        t0=t0,
        t0_epoch=t0_epoch,
        concurrency=concurrency,
        warmup_requests=warmup_requests,
        measured_requests=measured_requests,
        max_loop_lag=state.max_loop_lag,
        client_cpu_seconds=time.process_time() - cpu_started,
        wall_seconds=time.monotonic() - t0,
    )


def _record(
    index: int,
    phase: str,
    image_file: str,
    t0: float,
    scheduled_at: float,
    sent_at: float,
    ended_at: float,
    outcome: _Outcome,
) -> dict:
    def since_t0(moment: float | None) -> float | None:
        return None if moment is None else round(moment - t0, 6)

    def milliseconds(later: float | None, earlier: float) -> float | None:
        return None if later is None else round((later - earlier) * 1000, 3)

    return {
        "index": index,
        "phase": phase,
        "image_file": image_file,
        "scheduled_s": since_t0(scheduled_at),
        "sent_s": since_t0(sent_at),
        "first_token_s": since_t0(outcome.first_token_at),
        "end_s": since_t0(ended_at),
        "dispatch_lag_ms": milliseconds(sent_at, scheduled_at),
        "ttft_ms": milliseconds(outcome.first_token_at, sent_at),
        "e2e_ms": milliseconds(ended_at, sent_at),
        "output_tokens": outcome.output_tokens,
        "status": outcome.status,
        "error": outcome.error,
    }


def _write_records(out_path: Path, records: list[dict | None]) -> None:
    """Write the requests that ran, in index order, one JSON object per line."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as log:
        for record in records:
            if record is not None:
                log.write(json.dumps(record) + "\n")


def _draw_progress(state: _Progress, warmup_requests: int) -> None:
    phase = "warm-up" if state.done < warmup_requests else "measured"
    print(
        f"\r{phase}: {state.done}/{state.total} done, {state.ok} ok, "
        f"{state.errors} errors, {state.in_flight} in flight   ",
        end="",
        file=sys.stderr,
        flush=True,
    )


def _summary(records: list[dict | None], **figures: float | int) -> LoadSummary:
    ran = [record for record in records if record is not None]
    measured = [record for record in ran if record["phase"] == "measured"]
    warmup = [record for record in ran if record["phase"] == "warmup"]
    lags = [record["dispatch_lag_ms"] for record in ran]
    return LoadSummary(
        t0_monotonic=figures["t0"],
        t0_epoch=figures["t0_epoch"],
        concurrency=figures["concurrency"],
        warmup_requests=figures["warmup_requests"],
        measured_requests=figures["measured_requests"],
        measured_start_s=min((r["sent_s"] for r in measured), default=None),
        measured_end_s=max((r["end_s"] for r in measured), default=None),
        measured_ok=sum(1 for r in measured if r["error"] is None),
        measured_errors=sum(1 for r in measured if r["error"] is not None),
        warmup_ok=sum(1 for r in warmup if r["error"] is None),
        warmup_errors=sum(1 for r in warmup if r["error"] is not None),
        max_dispatch_lag_ms=max(lags, default=None),
        max_loop_lag_ms=round(figures["max_loop_lag"] * 1000, 3),
        client_cpu_seconds=figures["client_cpu_seconds"],
        wall_seconds=figures["wall_seconds"],
    )


# --- Readiness ------------------------------------------------------------------------


def local_session() -> requests.Session:
    """A session for this host's own servers: never through a proxy.

    ``requests`` sends even 127.0.0.1 through ``HTTP_PROXY`` unless ``NO_PROXY``
    says otherwise; the load itself (``http1``) opens its sockets directly.
    """
    session = requests.Session()
    session.trust_env = False
    return session


def wait_until_healthy(
    base_url: str,
    timeout_s: float,
    *,
    process: subprocess.Popen | None = None,
    poll_s: float = 0.05,
) -> float:
    """Poll GET /health until it answers 200; return the seconds it took.

    Raises ServerNeverHealthy when `timeout_s` passes or when `process` (a
    subprocess.Popen of the server) exits first; the caller adds the log tail.
    """
    url = base_url.rstrip("/") + "/health"
    started = time.monotonic()
    deadline = started + timeout_s
    last_answer = "no answer yet"
    with local_session() as session:
        while True:
            if process is not None and process.poll() is not None:
                raise ServerNeverHealthy(
                    f"The server process exited with code {process.returncode} "
                    f"before {url} answered 200 (last: {last_answer})."
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerNeverHealthy(
                    f"{url} did not answer 200 within {timeout_s:g} s "
                    f"(last: {last_answer})."
                )
            try:
                response = session.get(url, timeout=max(0.1, min(5.0, remaining)))
                if response.status_code == 200:
                    return time.monotonic() - started
                last_answer = f"HTTP {response.status_code}"
            except requests.RequestException as error:
                last_answer = f"{type(error).__name__}"
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
