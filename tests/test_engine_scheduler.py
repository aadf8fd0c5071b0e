"""The scheduler process: receive path, continuous batching, cleanup on exit."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from conftest import release_transport_sources

from serving_study.engine.protocol import (
    SHM,
    FeaturePayload,
    RequestFailed,
    SchedulerReady,
    SubmitRequest,
    TokenBatch,
)
from serving_study.engine.scheduler import (
    SchedulerSettings,
    TimingModel,
    start_scheduler,
)
from serving_study.engine.segments import SHM_DIRECTORY, unlink_segment
from serving_study.engine.shm_loader import (
    MM_UTILS_RELATIVE_PATH,
    VariantTransport,
    load_variant_transport,
)

MESSAGE_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def variant(transport_sources_0_5_23):
    return load_variant_transport(transport_sources_0_5_23)


@pytest.fixture(scope="module")
def segments():
    """Names of segments the tests create; unlinked if a test left any."""
    names: list[str] = []
    yield names
    for name in names:
        unlink_segment(name)


def _start(variant: VariantTransport, timing: TimingModel):
    sglang_root = variant.mm_utils_path.parents[len(MM_UTILS_RELATIVE_PATH.parts) - 1]
    settings = SchedulerSettings(
        sglang_source=sglang_root,
        mm_utils_sha256=variant.mm_utils_sha256,
        timing=timing,
        parent_pid=os.getpid(),
    )
    process, connection = start_scheduler(settings)
    assert connection.poll(MESSAGE_TIMEOUT_S), "scheduler sent no ready message"
    return process, connection


def _stop(process, connection) -> None:
    connection.close()
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join()


@pytest.fixture(scope="module")
def batching_scheduler(variant):
    """A scheduler with room for two running requests, and its ready message."""
    timing = TimingModel(
        prefill_ms_per_image=50, decode_step_ms=5, max_running_requests=2
    )
    process, connection = _start(variant, timing)
    ready = connection.recv()
    try:
        yield process, connection, ready
    finally:
        _stop(process, connection)


def _shm_request(pointer_class, segments, request_id: int, output_tokens: int):
    pointer = pointer_class(torch.full((64, 1536), float(request_id)))
    name = pointer.__getstate__()["shm_name"]
    segments.append(name)
    payload = FeaturePayload(kind=SHM, pickled=pickle.dumps(pointer), segment_name=name)
    return SubmitRequest(request_id, (payload,), output_tokens)


def _receive(connection):
    assert connection.poll(MESSAGE_TIMEOUT_S), "scheduler went silent"
    return connection.recv()


def test_continuous_batching_respects_max_running_requests(
    batching_scheduler, variant, segments
):
    process, connection, ready = batching_scheduler
    pointer_class = variant.shm_pointer_class
    assert isinstance(ready, SchedulerReady)
    assert ready.pid == process.pid
    assert ready.torch_num_threads == 1
    assert ready.receive_path == "materialize"

    output_tokens = {1: 4, 2: 2, 3: 2}
    for request_id, tokens in output_tokens.items():
        message = _shm_request(pointer_class, segments, request_id, tokens)
        connection.send_bytes(pickle.dumps(message))

    order = []
    finished = set()
    while finished != set(output_tokens):
        message = _receive(connection)
        assert isinstance(message, TokenBatch)
        for event in message.events:
            order.append((event.request_id, event.token_index))
            if event.finished:
                finished.add(event.request_id)
                assert event.token_index == output_tokens[event.request_id] - 1

    for request_id, tokens in output_tokens.items():
        indexes = [index for rid, index in order if rid == request_id]
        assert indexes == list(range(tokens))
    # Request 2 joined the running batch while request 1 was decoding ...
    assert order.index((2, 0)) < order.index((1, 3))
    # ... and request 3 had to wait for a free slot (2 finished first).
    assert order.index((3, 0)) > order.index((2, 1))
    # materialize() unlinked every segment on receipt.
    assert [name for name in segments if (SHM_DIRECTORY / name).exists()] == []


def test_request_whose_segment_vanished_fails_cleanly(
    batching_scheduler, variant, segments
):
    _, connection, _ = batching_scheduler
    message = _shm_request(variant.shm_pointer_class, segments, 7, 3)
    unlink_segment(message.features[0].segment_name)
    connection.send_bytes(pickle.dumps(message))

    reply = _receive(connection)
    assert isinstance(reply, RequestFailed)
    assert reply.request_id == 7
    assert "FileNotFoundError" in reply.error


def test_scheduler_unlinks_unconsumed_segments_when_the_pipe_closes(variant, segments):
    timing = TimingModel(prefill_ms_per_image=3000, max_running_requests=1)
    process, connection = _start(variant, timing)
    connection.recv()
    pointer_class = variant.shm_pointer_class
    first = _shm_request(pointer_class, segments, 1, 2)
    connection.send_bytes(pickle.dumps(first))
    # Request 2 arrives while request 1's prefill holds the "GPU".
    second = _shm_request(pointer_class, segments, 2, 2)
    connection.send_bytes(pickle.dumps(second))
    assert (SHM_DIRECTORY / second.features[0].segment_name).exists()

    _stop(process, connection)

    assert process.exitcode == 0
    assert (SHM_DIRECTORY / first.features[0].segment_name).exists() is False
    assert (SHM_DIRECTORY / second.features[0].segment_name).exists() is False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("version", "receive_path"), [("0.5.9", "unpickle"), ("0.5.16", "materialize")]
)
def test_older_releases_take_their_own_receive_path(
    version, receive_path, tmp_path, pytestconfig
):
    sglang_root = release_transport_sources(pytestconfig, version, tmp_path)
    older = load_variant_transport(sglang_root)
    process, connection = _start(older, TimingModel(decode_step_ms=1))
    segments: list[str] = []
    try:
        assert _receive(connection).receive_path == receive_path
        message = _shm_request(older.shm_pointer_class, segments, 1, 2)
        connection.send_bytes(pickle.dumps(message))
        events = [event for _ in range(2) for event in _receive(connection).events]
        assert [(event.token_index, event.finished) for event in events] == [
            (0, False),
            (1, True),
        ]
        assert not (SHM_DIRECTORY / segments[0]).exists()
    finally:
        _stop(process, connection)
        for name in segments:
            unlink_segment(name)
