"""The scheduler process: SGLang's receive path, then a stand-in for the GPU.

Started by the main process with multiprocessing `spawn`, as SGLang starts its
`sglang::scheduler`. It receives requests, unpickles each image's
`ShmPointerMMData` (which opens the segment) and materialises it exactly as
the variant's release does, touches every page of the tensor, and then runs a
timing model with continuous batching in place of the model:

- each iteration admits waiting requests, up to `max_running_requests`; their
  prefill costs `prefill_ms_per_image` per image and yields the first token;
- then one decode step of `decode_step_ms` gives every running request one
  more token.

It waits by sleeping (in `poll` on the pipe, so arriving requests are
buffered as ZMQ would buffer them), except for `busy_fraction` of each step
spent spinning: SGLang's scheduler kept 40-99% of a core busy in the study.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

from serving_study.engine.protocol import (
    CUDA_IPC,
    SHM,
    AbortRequest,
    FeaturePayload,
    RequestFailed,
    SchedulerReady,
    SubmitRequest,
    TokenBatch,
    TokenEvent,
)
from serving_study.engine.segments import release_segments, unlink_segment

PROCESS_TITLE = "sglang::scheduler"
IDLE_POLL_SECONDS = 0.2
PAGE_BYTES = 4096

logger = logging.getLogger("serving_study.engine.scheduler")


@dataclass(frozen=True)
class TimingModel:
    """What the stand-in model charges, calibrated to the study's A100 arms."""

    prefill_ms_per_image: float = 20.0
    decode_step_ms: float = 10.0
    max_running_requests: int = 64
    busy_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.prefill_ms_per_image < 0 or self.decode_step_ms < 0:
            raise ValueError("prefill and decode times must not be negative")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be at least 1")
        if not 0.0 <= self.busy_fraction <= 1.0:
            raise ValueError(
                f"busy_fraction {self.busy_fraction} is outside [0, 1]: it is "
                "the share of each step the scheduler spins instead of sleeping"
            )


@dataclass(frozen=True)
class SchedulerSettings:
    sglang_source: Path
    mm_utils_sha256: str
    timing: TimingModel
    parent_pid: int


class MainProcessGone(Exception):
    """The pipe to the main process closed or the parent process died."""


# A scheduler process started before the engine needed it: its settings, the
# process, and the main process's end of the pipe.
EarlyScheduler = tuple[SchedulerSettings, BaseProcess, Connection]


def start_scheduler(settings: SchedulerSettings) -> tuple[BaseProcess, Connection]:
    """Spawn the scheduler process; return it and the main process's pipe end."""
    context = multiprocessing.get_context("spawn")
    main_end, scheduler_end = context.Pipe(duplex=True)
    process = context.Process(
        target=run_scheduler,
        args=(settings, scheduler_end),
        name=PROCESS_TITLE,
        daemon=True,
    )
    process.start()
    # Only the scheduler may hold its end, so that its death reads as EOF here.
    scheduler_end.close()
    return process, main_end


def run_scheduler(settings: SchedulerSettings, connection: Connection) -> None:
    """Entry point of the scheduler process."""
    import setproctitle

    setproctitle.setproctitle(PROCESS_TITLE)
    logging.basicConfig(
        level=logging.INFO,
        format="[%(asctime)s] scheduler %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    # SIGTERM must run the cleanup in `finally`, as SystemExit does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Ctrl-C goes to the whole process group; the main process decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    # Imported after the title is set: torch takes a second or two to load.
    import torch

    from serving_study.engine.shm_loader import load_variant_transport

    # As SGLang's model runner does in the scheduler process.
    torch.set_num_threads(1)
    transport = load_variant_transport(settings.sglang_source)
    if transport.mm_utils_sha256 != settings.mm_utils_sha256:
        raise RuntimeError(
            f"{transport.mm_utils_path} changed after the main process loaded "
            "it; restart the engine"
        )
    scheduler = Scheduler(
        settings, transport.materializes, connection, torch.cuda.is_available()
    )
    try:
        scheduler.send(
            SchedulerReady(
                pid=os.getpid(),
                torch_num_threads=torch.get_num_threads(),
                receive_path="materialize" if transport.materializes else "unpickle",
            )
        )
        scheduler.serve_forever()
    except MainProcessGone:
        logger.info("main process is gone; scheduler exits")
    except SystemExit:  # SIGTERM
        logger.info("terminated; scheduler exits")
    finally:
        scheduler.release_unconsumed_segments()
    exit_without_teardown(0)


def exit_without_teardown(exit_code: int) -> None:
    """End the process at once, after flushing logs and standard streams.

    The interpreter's own teardown with torch loaded takes about a second on a
    small host, and the main process waits for the scheduler at every stop; by
    now every segment is released and nothing else needs cleaning up.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


@dataclass
class WaitingRequest:
    request_id: int
    output_tokens: int
    features: list


@dataclass
class RunningRequest:
    request_id: int
    output_tokens: int
    tokens_produced: int = 0


class Scheduler:
    def __init__(
        self,
        settings: SchedulerSettings,
        materializes: bool,
        connection: Connection,
        has_gpu: bool,
    ) -> None:
        self._settings = settings
        self._timing = settings.timing
        self._materializes = materializes
        self._connection = connection
        self._has_gpu = has_gpu
        self._inbox: deque[bytes] = deque()
        self._waiting: deque[WaitingRequest] = deque()
        self._running: dict[int, RunningRequest] = {}

    def serve_forever(self) -> None:
        while True:
            if not self._waiting and not self._running:
                self._wait(IDLE_POLL_SECONDS, stop_when_message_arrives=True)
            self._check_parent_alive()
            self._process_inbox()
            self._prefill_admitted(self._admit())
            self._decode_step()

    def release_unconsumed_segments(self) -> None:
        """Unlink the segments of requests this process never materialised."""
        with contextlib.suppress(EOFError, OSError):
            while self._connection.poll(0):
                self._inbox.append(self._connection.recv_bytes())
        for raw in self._inbox:
            message = pickle.loads(raw)
            if isinstance(message, SubmitRequest):
                for payload in message.features:
                    if payload.segment_name and unlink_segment(payload.segment_name):
                        logger.info("unlinked unconsumed %s", payload.segment_name)
        self._inbox.clear()

    def _process_inbox(self) -> None:
        while self._inbox:
            message = pickle.loads(self._inbox.popleft())
            if isinstance(message, SubmitRequest):
                self._receive_request(message)
            elif isinstance(message, AbortRequest):
                self._abort(message.request_id)

    def _receive_request(self, message: SubmitRequest) -> None:
        features = []
        for position, payload in enumerate(message.features):
            try:
                features.append(self._receive_feature(payload))
            except Exception as error:
                release_segments(message.features[position:])
                logger.exception("request %d: receiving features", message.request_id)
                reason = f"{type(error).__name__}: {error}"
                self.send(RequestFailed(message.request_id, reason))
                return
        waiting = WaitingRequest(message.request_id, message.output_tokens, features)
        self._waiting.append(waiting)

    def _receive_feature(self, payload: FeaturePayload):
        """Turn one payload into a tensor the way the variant's scheduler does."""
        received = pickle.loads(payload.pickled)
        if payload.kind == SHM:
            if self._materializes:
                # 0.5.10+: unpickling opened the segment; materialize() takes
                # the pixels (0.5.22+: a private copy-on-write map) and unlinks.
                tensor = received.materialize()
            else:
                # 0.5.9: unpickling already cloned the pixels and unlinked.
                tensor = received.tensor
        else:
            tensor = received
        self._touch(tensor, on_gpu=payload.kind == CUDA_IPC)
        return tensor

    def _touch(self, tensor, on_gpu: bool) -> None:
        """Read the pixels as the vision encoder would start to."""
        if self._has_gpu and not on_gpu:
            tensor.to("cuda")
            return
        flat = tensor.reshape(-1)
        # One element per page: every page is faulted in, at little compute.
        stride = max(1, PAGE_BYTES // flat.element_size())
        flat[::stride].sum().item()

    def _abort(self, request_id: int) -> None:
        self._running.pop(request_id, None)
        self._waiting = deque(
            waiting for waiting in self._waiting if waiting.request_id != request_id
        )

    def _admit(self) -> list[WaitingRequest]:
        admitted = []
        while self._waiting and (
            len(self._running) + len(admitted) < self._timing.max_running_requests
        ):
            admitted.append(self._waiting.popleft())
        return admitted

    def _prefill_admitted(self, admitted: list[WaitingRequest]) -> None:
        if not admitted:
            return
        images = sum(len(request.features) for request in admitted)
        self._spend(images * self._timing.prefill_ms_per_image / 1000)
        events = []
        for request in admitted:
            request.features.clear()  # the vision encoder has consumed them
            running = RunningRequest(request.request_id, request.output_tokens)
            events.append(self._produce_token(running))
        self.send(TokenBatch(tuple(events)))

    def _decode_step(self) -> None:
        if not self._running:
            return
        self._spend(self._timing.decode_step_ms / 1000)
        events = [
            self._produce_token(running) for running in list(self._running.values())
        ]
        self.send(TokenBatch(tuple(events)))

    def _produce_token(self, request: RunningRequest) -> TokenEvent:
        request.tokens_produced += 1
        finished = request.tokens_produced >= request.output_tokens
        if finished:
            self._running.pop(request.request_id, None)
        else:
            self._running[request.request_id] = request
        return TokenEvent(request.request_id, request.tokens_produced - 1, finished)

    def _spend(self, seconds: float) -> None:
        """Take `seconds` of wall time: spin for the busy share, then sleep."""
        start = time.perf_counter()
        spin_until = start + seconds * self._timing.busy_fraction
        while time.perf_counter() < spin_until:
            pass
        self._wait(
            start + seconds - time.perf_counter(), stop_when_message_arrives=False
        )

    def _wait(self, seconds: float, stop_when_message_arrives: bool) -> None:
        """Sleep up to `seconds`, buffering messages that arrive meanwhile.

        With `stop_when_message_arrives`, return as soon as something came,
        after taking in everything that is already there.
        """
        deadline = time.perf_counter() + seconds
        try:
            while (remaining := deadline - time.perf_counter()) > 0:
                if not self._connection.poll(remaining):
                    return
                self._inbox.append(self._connection.recv_bytes())
                if stop_when_message_arrives:
                    while self._connection.poll(0):
                        self._inbox.append(self._connection.recv_bytes())
                    return
        except (EOFError, OSError) as error:
            raise MainProcessGone from error

    def send(self, message: object) -> None:
        try:
            self._connection.send(message)
        except OSError as error:
            raise MainProcessGone from error

    def _check_parent_alive(self) -> None:
        if os.getppid() != self._settings.parent_pid:
            raise MainProcessGone
