"""The load client against small real HTTP servers written here."""

import asyncio
import base64
import hashlib
import http.server
import io
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from PIL import Image

from serving_study.measure.chat_requests import ChatRequest, load_requests
from serving_study.measure.chat_stream import CARRIES_TOKEN, _has_token
from serving_study.measure.client import run_load
from serving_study.measure.server_queries import ServerNeverHealthy, wait_until_healthy

MODEL = "test-model"
REQUEST_TIMEOUT_S = 60
PROMPT = "describe the picture"


def write_workload(directory: Path, images: int = 3) -> Path:
    """A manifest with small noise PNGs, as workloads.py writes them."""
    (directory / "images").mkdir()
    entries = []
    for index in range(images):
        pixels = np.random.default_rng(index).integers(0, 256, (8, 8, 3), np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        relative = f"images/{index:06d}.png"
        (directory / relative).write_bytes(buffer.getvalue())
        entries.append(
            {
                "file": relative,
                "sha256": hashlib.sha256(buffer.getvalue()).hexdigest(),
                "format": "png",
                "width": 8,
                "height": 8,
            }
        )
    manifest = {"name": "tiny", "prompt": PROMPT, "images": entries}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory / "manifest.json"


class FakeServer:
    """A streaming chat server that records what it got and how many were in flight.

    Requests whose arrival number is in `fail_with_500` get HTTP 500; those in
    `cut_stream` stop after two tokens without [DONE]; `send_usage` switches the
    usage chunk on or off.
    """

    def __init__(self, tokens=4, fail_with_500=(), cut_stream=(), send_usage=True):
        self.tokens = tokens
        self.fail_with_500 = set(fail_with_500)
        self.cut_stream = set(cut_stream)
        self.send_usage = send_usage
        self.arrivals = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.bodies = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        arrival = self.arrivals
        self.arrivals += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.bodies.append(json.loads(await request.read()))
            await asyncio.sleep(0.005)
            if arrival in self.fail_with_500:
                return web.Response(status=500, text="engine exploded")
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await self._send(response, {"choices": [{"delta": {"role": "assistant"}}]})
            for token in range(self.tokens):
                await asyncio.sleep(0.002)
                await self._send(
                    response, {"choices": [{"delta": {"content": f"t{token} "}}]}
                )
                if arrival in self.cut_stream and token == 1:
                    return response
            if self.send_usage:
                usage = {"prompt_tokens": 70, "completion_tokens": self.tokens}
                await self._send(response, {"choices": [], "usage": usage})
            await response.write(b"data: [DONE]\n\n")
            return response
        finally:
            self.in_flight -= 1

    @staticmethod
    async def _send(response: web.StreamResponse, chunk: dict) -> None:
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")


async def run_against(server: FakeServer, chat_requests, out_path, **settings):
    app = web.Application(client_max_size=2**26)
    app.router.add_post("/v1/chat/completions", server.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        return await run_load(
            f"http://127.0.0.1:{port}",
            chat_requests,
            model=MODEL,
            output_tokens=server.tokens,
            out_path=out_path,
            progress=False,
            request_timeout_s=REQUEST_TIMEOUT_S,
            **settings,
        )
    finally:
        await runner.cleanup()


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_load_requests_builds_openai_bodies_from_the_manifest(tmp_path):
    manifest = write_workload(tmp_path)
    chat_requests = load_requests(manifest)
    assert [r.image_file for r in chat_requests] == [
        "images/000000.png",
        "images/000001.png",
        "images/000002.png",
    ]
    body = json.loads(chat_requests[1].body(model=MODEL, output_tokens=32))
    assert body["model"] == MODEL
    assert body["max_completion_tokens"] == 32
    assert body["temperature"] == 0
    assert body["stream"] is True and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}
    image_part, text_part = body["messages"][0]["content"]
    assert body["messages"][0]["role"] == "user"
    assert text_part == {"type": "text", "text": PROMPT}
    prefix = "data:image/png;base64,"
    url = image_part["image_url"]["url"]
    assert image_part["type"] == "image_url" and url.startswith(prefix)
    sent_image = base64.b64decode(url[len(prefix) :])
    assert sent_image == (tmp_path / "images/000001.png").read_bytes()


def test_load_requests_refuses_a_changed_image(tmp_path):
    manifest = write_workload(tmp_path)
    (tmp_path / "images/000002.png").write_bytes(b"not the image")
    with pytest.raises(ValueError, match="000002.png has sha256"):
        load_requests(manifest)


def test_closed_loop_logs_every_request_and_never_exceeds_concurrency(tmp_path):
    chat_requests = load_requests(write_workload(tmp_path))
    server = FakeServer(tokens=4)
    out_path = tmp_path / "requests.jsonl"
    hooks = []
    summary = asyncio.run(
        run_against(
            server,
            chat_requests,
            out_path,
            concurrency=3,
            measured_requests=20,
            warmup_requests=5,
            on_measured_start=lambda: hooks.append(("start", time.monotonic())),
            on_measured_end=lambda: hooks.append(("end", time.monotonic())),
        )
    )
    records = read_log(out_path)
    assert [r["index"] for r in records] == list(range(25))
    assert [r["phase"] for r in records] == ["warmup"] * 5 + ["measured"] * 20
    assert [r["image_file"] for r in records[:4]] == [
        "images/000000.png",
        "images/000001.png",
        "images/000002.png",
        "images/000000.png",
    ]
    assert server.arrivals == 25
    assert server.most_in_flight == 3
    for record in records:
        assert record["error"] is None and record["status"] == 200
        assert record["output_tokens"] == 4
        assert record["scheduled_s"] <= record["sent_s"] < record["first_token_s"]
        assert record["first_token_s"] < record["end_s"]
        assert 0 < record["ttft_ms"] < record["e2e_ms"]
        assert record["dispatch_lag_ms"] >= 0
        # One gap between each two of the four token chunks, within the stream.
        assert len(record["itl_ms"]) == 3 and min(record["itl_ms"]) >= 0
        assert sum(record["itl_ms"]) <= record["e2e_ms"] - record["ttft_ms"]
    # Closed loop: every request after the first three waits for a slot to free.
    ends = sorted(r["end_s"] for r in records)
    for record in records[3:]:
        assert record["scheduled_s"] in ends
    assert summary.measured_ok == 20 and summary.measured_errors == 0
    assert summary.warmup_ok == 5 and summary.warmup_errors == 0
    assert summary.measured_start_s == min(r["sent_s"] for r in records[5:])
    assert summary.measured_end_s == max(r["end_s"] for r in records[5:])
    assert summary.t0_epoch > 1e9
    (start_hook, start_at), (end_hook, end_at) = hooks
    assert (start_hook, end_hook) == ("start", "end")
    warmup_dispatched = max(r["scheduled_s"] for r in records[:5])
    start_s, end_s = start_at - summary.t0_monotonic, end_at - summary.t0_monotonic
    assert warmup_dispatched <= start_s <= summary.measured_start_s
    assert end_s >= summary.measured_end_s
    assert all(body["model"] == MODEL for body in server.bodies)


def test_server_errors_and_cut_streams_are_recorded(tmp_path):
    chat_requests = load_requests(write_workload(tmp_path))
    server = FakeServer(tokens=4, fail_with_500={1}, cut_stream={3})
    out_path = tmp_path / "requests.jsonl"
    # Concurrency 1 makes arrival number equal request index.
    summary = asyncio.run(
        run_against(
            server,
            chat_requests,
            out_path,
            concurrency=1,
            measured_requests=5,
            warmup_requests=0,
        )
    )
    records = read_log(out_path)
    assert len(records) == 5
    assert records[1]["status"] == 500
    assert records[1]["error"] == "HTTP 500: engine exploded"
    assert records[1]["first_token_s"] is None and records[1]["ttft_ms"] is None
    assert records[3]["status"] == 200
    assert records[3]["error"] == "stream ended before [DONE]"
    assert records[3]["first_token_s"] is not None
    assert [records[i]["error"] for i in (0, 2, 4)] == [None, None, None]
    assert summary.measured_ok == 3 and summary.measured_errors == 2


def test_connection_refused_is_an_error_not_a_crash(tmp_path):
    chat_requests = load_requests(write_workload(tmp_path, images=1))
    out_path = tmp_path / "requests.jsonl"
    summary = asyncio.run(
        run_load(
            f"http://127.0.0.1:{unused_port()}",
            chat_requests,
            concurrency=2,
            measured_requests=3,
            warmup_requests=1,
            output_tokens=4,
            model=MODEL,
            out_path=out_path,
            progress=False,
            request_timeout_s=REQUEST_TIMEOUT_S,
        )
    )
    records = read_log(out_path)
    assert len(records) == 4
    assert all(r["status"] is None and "Connect" in r["error"] for r in records)
    assert summary.measured_errors == 3 and summary.warmup_errors == 1


def test_tokens_are_counted_when_the_server_sends_no_usage(tmp_path):
    chat_requests = load_requests(write_workload(tmp_path, images=1))
    server = FakeServer(tokens=6, send_usage=False)
    out_path = tmp_path / "requests.jsonl"
    asyncio.run(
        run_against(
            server,
            chat_requests,
            out_path,
            concurrency=2,
            measured_requests=2,
            warmup_requests=0,
        )
    )
    assert [r["output_tokens"] for r in read_log(out_path)] == [6, 6]
    assert [len(r["itl_ms"]) for r in read_log(out_path)] == [5, 5]


def test_chat_request_body_is_valid_json_for_any_model_name():
    request = ChatRequest(image_file="a.png", messages_json=b'[{"role":"user"}]')
    body = json.loads(request.body(model='odd "name"', output_tokens=1))
    assert body["model"] == 'odd "name"'
    assert body["messages"] == [{"role": "user"}]


# --- wait_until_healthy ---------------------------------------------------------------


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class HealthAfter(http.server.BaseHTTPRequestHandler):
    """Answers /health with 503 for the first `failures` polls, then 200."""

    failures = 2
    polls = 0

    def do_GET(self):  # noqa: N802 (the name http.server calls)
        type(self).polls += 1
        status = 503 if type(self).polls <= type(self).failures else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *arguments):
        pass


def test_wait_until_healthy_returns_once_health_answers_200():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HealthAfter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base_url = f"http://127.0.0.1:{server.server_address[1]}"
        waited = wait_until_healthy(base_url, timeout_s=10, poll_s=0.01)
        assert HealthAfter.polls == 3
        assert 0 <= waited < 10
    finally:
        server.shutdown()
        server.server_close()


def test_wait_until_healthy_reports_an_exited_process():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    with pytest.raises(ServerNeverHealthy, match="exited with code 3"):
        wait_until_healthy(
            f"http://127.0.0.1:{unused_port()}", timeout_s=10, process=process
        )


def test_wait_until_healthy_times_out_with_the_last_answer():
    with pytest.raises(ServerNeverHealthy, match="within 0.3 s.*ConnectionError"):
        wait_until_healthy(f"http://127.0.0.1:{unused_port()}", 0.3, poll_s=0.05)


@pytest.mark.parametrize(
    "delta",
    [
        {"content": "t1 "},
        {"content": ""},
        {"content": None},
        {"role": "assistant"},
        {"reasoning_content": "hm"},
        {"content": None, "reasoning_content": ""},
        {"content": 'say "content": "x"'},
    ],
)
@pytest.mark.parametrize("separators", [(", ", ": "), (",", ":")])
def test_a_chunk_is_told_to_carry_a_token_from_its_bytes_as_from_its_json(
    delta, separators
):
    """The chunks after the first token are timed without decoding them."""
    chunk = {"choices": [{"index": 0, "delta": delta}]}
    payload = json.dumps(chunk, separators=separators).encode()
    assert bool(CARRIES_TOKEN.search(payload)) == _has_token(chunk)
