"""The engine as a real server: processes, HTTP, SSE, /dev/shm, signals."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
import torch
from PIL import Image

import serving_study
from serving_study.engine.segments import list_segments
from serving_study.engine.shm_loader import MM_UTILS_RELATIVE_PATH

READY_LINE = "The server is fired up and ready to roll!"
STARTUP_TIMEOUT_S = 120
REQUEST_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def image_url() -> str:
    pixels = np.random.default_rng(11).integers(0, 256, (512, 512, 3))
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


class EngineProcess:
    """One `python -m serving_study.engine` process, its log and its URL."""

    def __init__(self, sglang_source: Path, log_path: Path, *extra_arguments: str):
        self.port = _free_port()
        self.log_path = log_path
        command = [
            sys.executable,
            "-m",
            "serving_study.engine",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--sglang-source",
            str(sglang_source),
            "--served-model-name",
            "test-model",
            *extra_arguments,
        ]
        source_root = str(Path(serving_study.__file__).parents[1])
        python_path = os.pathsep.join(
            filter(None, [source_root, os.getenv("PYTHONPATH")])
        )
        environment = {**os.environ, "PYTHONPATH": python_path, "OMP_NUM_THREADS": "2"}
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=environment
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"engine exited during startup:\n{self.log()}")
            try:
                if requests.get(self.url("/health"), timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        pytest.fail(f"engine not healthy after {STARTUP_TIMEOUT_S} s:\n{self.log()}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


@pytest.fixture
def start_engine(tmp_path):
    engines: list[EngineProcess] = []

    def start(sglang_source: Path, *extra_arguments: str) -> EngineProcess:
        log_path = tmp_path / f"server-{len(engines)}.log"
        engine = EngineProcess(sglang_source, log_path, *extra_arguments)
        engines.append(engine)
        engine.wait_healthy()
        return engine

    yield start
    for engine in engines:
        engine.stop()


@pytest.fixture(scope="module")
def engine_pool(transport_sources_0_5_23, tmp_path_factory):
    """One engine for the module, restarted if a test (SIGTERM) stopped it."""
    started: list[EngineProcess] = []

    def running() -> EngineProcess:
        if not started or started[-1].process.poll() is not None:
            log_path = tmp_path_factory.mktemp("engine") / "server.log"
            timing = ("--prefill-ms-per-image", "5", "--decode-step-ms", "2")
            started.append(EngineProcess(transport_sources_0_5_23, log_path, *timing))
            started[-1].wait_healthy()
        return started[-1]

    yield running
    for engine in started:
        engine.stop()


@pytest.fixture
def engine(engine_pool) -> EngineProcess:
    return engine_pool()


def _chat_body(image_url: str, max_tokens: int, stream: bool) -> dict:
    return {
        "model": "test-model",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image_url}},
                    {"type": "text", "text": "What is in this image?"},
                ],
            }
        ],
        "max_completion_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }


def _sse_payloads(response: requests.Response) -> list:
    payloads = []
    for line in response.iter_lines():
        if line:
            assert line.startswith(b"data: "), line
            data = line[len(b"data: ") :].decode()
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def _segments_of(pid: int) -> list[str]:
    return list_segments(f"sgl_shm_mm_{pid}_")


def _children_titled(parent_pid: int, title: str) -> list[int]:
    listing = subprocess.run(
        ["ps", "-e", "-o", "pid=,ppid=,args="],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pids = []
    for line in listing.splitlines():
        pid, ppid, arguments = line.split(None, 2)
        if int(ppid) == parent_pid and arguments.strip() == title:
            pids.append(int(pid))
    return pids


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_exit(pid: int, timeout_s: float) -> bool:
    """True once the process is gone (a zombie counts as gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


# --- a healthy engine ----------------------------------------------------------


def test_streaming_chat_follows_sglang_sse_sequence(engine, image_url):
    response = requests.post(
        engine.url("/v1/chat/completions"),
        json=_chat_body(image_url, max_tokens=12, stream=True),
        stream=True,
        timeout=REQUEST_TIMEOUT_S,
    )
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    payloads = _sse_payloads(response)

    first, *tokens, finish, usage, done = payloads
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(tokens) == 12
    assert all(chunk["choices"][0]["delta"]["content"] for chunk in tokens)
    assert finish["choices"][0]["finish_reason"] == "length"
    assert not finish["choices"][0]["delta"].get("content")
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 12
    assert usage["usage"]["prompt_tokens"] > 256  # the image's 256 tokens
    assert done == "[DONE]"
    assert len({chunk["id"] for chunk in payloads[:-1]}) == 1
    assert _segments_of(engine.pid) == []


def test_non_streaming_chat_returns_one_completion(engine, image_url):
    response = requests.post(
        engine.url("/v1/chat/completions"),
        json=_chat_body(image_url, max_tokens=5, stream=False),
        timeout=REQUEST_TIMEOUT_S,
    )
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] == 5
    assert len(body["choices"][0]["message"]["content"].split()) == 5
    assert _segments_of(engine.pid) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([{"type": "text", "text": "no image here"}], "no image"),
        (
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}],
            "not valid base64",
        ),
        (
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}],
            "cannot decode the image",
        ),
    ],
)
def test_bad_requests_get_400_with_a_json_error(engine, content, message):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2}
    response = requests.post(
        engine.url("/v1/chat/completions"), json=body, timeout=REQUEST_TIMEOUT_S
    )
    assert response.status_code == 400
    assert message in response.json()["message"]


def test_models_and_server_info_describe_the_running_engine(
    engine, transport_sources_0_5_23
):
    models = requests.get(engine.url("/v1/models"), timeout=10).json()
    assert models["data"][0]["id"] == "test-model"

    info = requests.get(engine.url("/server_info"), timeout=10).json()
    mm_utils = (transport_sources_0_5_23 / MM_UTILS_RELATIVE_PATH).resolve()
    assert info["pid"] == engine.pid
    assert info["thread_env"]["OMP_NUM_THREADS"] == "2"
    assert info["torch_num_threads"] == 2
    assert info["scheduler_torch_num_threads"] == 1
    assert info["transport"] == "cpu"
    assert info["mm_utils_path"] == str(mm_utils)
    assert info["timing"]["decode_step_ms"] == 2.0
    assert info["cgroup"] == Path("/proc/self/cgroup").read_text().splitlines()
    assert info["request_path"]["images"] >= 1  # the warm-up went through it


def test_scheduler_is_a_titled_child_of_the_server(engine):
    info = requests.get(engine.url("/server_info"), timeout=10).json()
    assert _children_titled(engine.pid, "sglang::scheduler") == [info["scheduler_pid"]]
    assert READY_LINE in engine.log()


# --- signals (the SIGTERM test stops the module's engine, so it comes last) ---


def test_killed_scheduler_turns_requests_into_500s(
    start_engine, transport_sources_0_5_23_patched, image_url
):
    engine = start_engine(transport_sources_0_5_23_patched, "--decode-step-ms", "20")
    info = requests.get(engine.url("/server_info"), timeout=10).json()
    patched_file = transport_sources_0_5_23_patched / MM_UTILS_RELATIVE_PATH
    assert info["mm_utils_path"] == str(patched_file.resolve())
    in_flight = requests.post(
        engine.url("/v1/chat/completions"),
        json=_chat_body(image_url, max_tokens=1000, stream=True),
        stream=True,
        timeout=REQUEST_TIMEOUT_S,
    )
    lines = in_flight.iter_lines()
    next(line for line in lines if line)

    os.kill(info["scheduler_pid"], signal.SIGKILL)
    tail = [line for line in lines if line]  # ends instead of hanging
    assert b'"code": 500' in tail[-1]

    after = requests.post(
        engine.url("/v1/chat/completions"),
        json=_chat_body(image_url, max_tokens=4, stream=True),
        timeout=REQUEST_TIMEOUT_S,
    )
    assert after.status_code == 500
    assert "scheduler" in after.json()["message"]
    assert requests.get(engine.url("/health"), timeout=10).status_code == 503
    assert _segments_of(engine.pid) == []
    assert engine.stop() == 0


@pytest.mark.slow
def test_scheduler_exits_when_the_server_is_killed(
    start_engine, transport_sources_0_5_23
):
    engine = start_engine(transport_sources_0_5_23)
    scheduler_pid = requests.get(engine.url("/server_info"), timeout=10).json()[
        "scheduler_pid"
    ]
    engine.process.kill()
    engine.process.wait()
    assert _wait_for_exit(scheduler_pid, 10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("transport", ["cpu", "cuda_ipc"])
def test_on_a_gpu_images_are_preprocessed_there_and_both_transports_serve(
    start_engine, transport_sources_0_5_23, image_url, transport
):
    engine = start_engine(transport_sources_0_5_23, "--transport", transport)
    response = requests.post(
        engine.url("/v1/chat/completions"),
        json=_chat_body(image_url, max_tokens=4, stream=True),
        stream=True,
        timeout=REQUEST_TIMEOUT_S,
    )
    assert _sse_payloads(response)[-1] == "[DONE]"
    info = requests.get(engine.url("/server_info"), timeout=10).json()
    assert info["preprocess_device"] == "cuda"
    assert info["gpu_name"]
    stages = info["request_path"]["stages"]
    if transport == "cpu":
        # The pixels came back from the GPU before the variant's SHM copy.
        assert stages["device_to_host"]["wall_s"] > 0
    else:
        assert stages["device_to_host"]["wall_s"] == 0
        assert _segments_of(engine.pid) == []


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_cuda_ipc_without_a_gpu_exits_with_advice(transport_sources_0_5_23, tmp_path):
    log_path = tmp_path / "server.log"
    engine = EngineProcess(
        transport_sources_0_5_23, log_path, "--transport", "cuda_ipc"
    )
    assert engine.process.wait(60) == 2
    assert "transport cuda_ipc needs a CUDA GPU; use transport: cpu" in engine.log()


def test_sigterm_ends_requests_stops_scheduler_and_unlinks_segments(engine, image_url):
    scheduler_pid = requests.get(engine.url("/server_info"), timeout=10).json()[
        "scheduler_pid"
    ]
    response = requests.post(
        engine.url("/v1/chat/completions"),
        json=_chat_body(image_url, max_tokens=5000, stream=True),
        stream=True,
        timeout=REQUEST_TIMEOUT_S,
    )
    lines = response.iter_lines()
    assert b'"role": "assistant"' in next(line for line in lines if line)
    engine.process.send_signal(signal.SIGTERM)
    remaining = [line for line in lines if line]  # ends instead of hanging

    assert engine.process.wait(30) == 0
    assert b"data: [DONE]" not in remaining
    assert _wait_for_exit(scheduler_pid, 10)
    assert _segments_of(engine.pid) == []
    assert "stop requested" in engine.log()
