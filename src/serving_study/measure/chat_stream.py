"""One streaming chat request: send it, read its server-sent events to [DONE].

What a request's log line needs comes from its stream: the HTTP status, the moment
of the first token and of every later chunk that carries a token (as SGLang's
``bench_serving`` times them, one time per chunk read), the output tokens (from
the usage chunk, else counted), and what went wrong. The connection is read to the
body's end so it can be reused.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

from serving_study.measure import http1

STREAM_END_WAIT_S = 1.0  # after [DONE], for the body's end
# A delta whose content (or reasoning_content) is a non-empty string, in a chunk's
# raw JSON: text inside a string has its quotes escaped, so it cannot match.
CARRIES_TOKEN = re.compile(rb'content":\s*"(?!")')


@dataclass
class StreamOutcome:
    """What one request's stream showed; filled as the stream is read."""

    status: int | None = None
    error: str | None = None
    first_token_at: float | None = None
    token_chunk_times: list[float] = field(default_factory=list)
    output_tokens: int | None = None


async def stream_chat(
    connections: http1.Connections, request: bytes, outcome: StreamOutcome
) -> None:
    """Send one prepared request and read its SSE stream to [DONE], filling `outcome`.

    Only the events up to the first token are decoded on the way; later ones are
    kept as bytes with the time they were read and looked at once [DONE] came,
    which keeps the client's CPU per request low.
    """
    response = await http1.send(connections, request)
    try:
        outcome.status = response.status
        if response.status != 200:
            text = (await response.read_all()).decode(errors="replace")
            outcome.error = f"HTTP {response.status}: {text[:300]}"
            return
        after_first_token: list[tuple[bytes, float]] = []
        pending = b""
        async for data in response.pieces:
            read_at = time.monotonic()
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
                    after_first_token.append((payload, read_at))
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    outcome.error = f"error event in stream: {chunk['error']}"[:300]
                    return
                if outcome.first_token_at is None and _has_token(chunk):
                    outcome.first_token_at = read_at
                    after_first_token.append((payload, read_at))
        outcome.error = "stream ended before [DONE]"
    finally:
        await connections.release(response)


def _finish(outcome: StreamOutcome, read: list[tuple[bytes, float]]) -> None:
    """The times of the chunks that carry a token, and the output tokens: from the
    stream's usage chunk, else by counting those chunks. Only the last two chunks
    are decoded (usage sits there); the others are told by their bytes."""
    outcome.token_chunk_times = [
        at for payload, at in read if CARRIES_TOKEN.search(payload)
    ]
    for payload, _ in reversed(read[-2:]):
        usage = json.loads(payload).get("usage")
        if usage and usage.get("completion_tokens") is not None:
            outcome.output_tokens = usage["completion_tokens"]
            return
    outcome.output_tokens = len(outcome.token_chunk_times)


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
