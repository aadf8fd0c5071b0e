"""The main process's side of the scheduler: start it, submit, route tokens.

Token batches arrive on the pipe, which is watched by the event loop
(`add_reader`), so no thread is involved: each readable event drains the pipe
and puts every token into its request's queue. EOF on the pipe means the
scheduler died: every request in flight fails, and later submits are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import pickle
from dataclasses import dataclass, field

from serving_study.engine.protocol import (
    AbortRequest,
    RequestFailed,
    SchedulerReady,
    SubmitRequest,
    TokenBatch,
    TokenEvent,
)
from serving_study.engine.request_path import PreparedImages
from serving_study.engine.scheduler import (
    EarlyScheduler,
    SchedulerSettings,
    start_scheduler,
)
from serving_study.engine.segments import release_segments

SCHEDULER_EXIT_GRACE_SECONDS = 5.0

logger = logging.getLogger("serving_study.engine.scheduler_client")


class SchedulerUnavailable(RuntimeError):
    """The scheduler process is not running (HTTP 500)."""


class GenerationFailed(RuntimeError):
    """The scheduler could not finish the request (HTTP 500)."""


@dataclass
class PendingRequest:
    request_id: int
    prepared: PreparedImages
    events: asyncio.Queue = field(default_factory=asyncio.Queue)

    async def tokens(self):
        """Yield this request's TokenEvents; raise GenerationFailed on failure."""
        while True:
            event = await self.events.get()
            if isinstance(event, RequestFailed):
                raise GenerationFailed(event.error)
            yield event
            if event.finished:
                return


class SchedulerClient:
    def __init__(
        self, settings: SchedulerSettings, early: EarlyScheduler | None = None
    ) -> None:
        self._settings = settings
        self._early = early
        self._process = None
        self._connection = None
        self._ready: asyncio.Future | None = None
        self._pending: dict[int, PendingRequest] = {}
        self._request_ids = itertools.count(1)
        self.ready_message: SchedulerReady | None = None
        self.alive = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def start(self, timeout_s: float) -> SchedulerReady:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        if self._early is not None and self._early[0] == self._settings:
            _, self._process, self._connection = self._early
        else:
            if self._early is not None:  # started for other settings: not ours
                self._early[1].terminate()
            self._process, self._connection = start_scheduler(self._settings)
        self._early = None
        self.alive = True
        loop.add_reader(self._connection.fileno(), self._on_readable)
        logger.info("scheduler process started (pid %d)", self._process.pid)
        try:
            self.ready_message = await asyncio.wait_for(self._ready, timeout_s)
        except TimeoutError as error:
            raise SchedulerUnavailable(
                f"the scheduler sent no ready message within {timeout_s} s"
            ) from error
        return self.ready_message

    def submit(self, prepared: PreparedImages, output_tokens: int) -> PendingRequest:
        """Send one request; its tokens arrive in the returned request's queue."""
        if not self.alive:
            raise SchedulerUnavailable("the scheduler process is not running")
        pending = PendingRequest(next(self._request_ids), prepared)
        message = SubmitRequest(pending.request_id, prepared.payloads, output_tokens)
        self._pending[pending.request_id] = pending
        try:
            self._connection.send_bytes(pickle.dumps(message))
        except OSError as error:
            self._on_scheduler_exit()
            raise SchedulerUnavailable(
                f"cannot reach the scheduler: {error}"
            ) from error
        return pending

    def forget(self, pending: PendingRequest) -> None:
        """Drop a request; if it is still running, tell the scheduler to abort it."""
        if self._pending.pop(pending.request_id, None) is None or not self.alive:
            return
        try:
            self._connection.send_bytes(pickle.dumps(AbortRequest(pending.request_id)))
        except OSError:
            self._on_scheduler_exit()

    def stop(self) -> None:
        """Stop the scheduler (it unlinks what it holds), then unlink the rest."""
        process = self._process
        if process is not None:
            self._stop_reading()
            # EOF on its pipe makes a running scheduler exit cleanly; one still
            # starting up would notice only once started, so it gets SIGTERM.
            self._connection.close()
            if self.ready_message is None:
                process.terminate()
            process.join(SCHEDULER_EXIT_GRACE_SECONDS)
            if process.is_alive():
                logger.warning("scheduler did not exit on EOF; sending SIGTERM")
                process.terminate()
                process.join(SCHEDULER_EXIT_GRACE_SECONDS)
            if process.is_alive():
                process.kill()
                process.join()
        self._fail_all_pending("the engine is shutting down")

    def _on_readable(self) -> None:
        try:
            while self._connection.poll():
                self._dispatch(self._connection.recv())
        except (EOFError, OSError):
            self._on_scheduler_exit()

    def _dispatch(self, message: object) -> None:
        if isinstance(message, TokenBatch):
            for event in message.events:
                self._deliver(event.request_id, event)
        elif isinstance(message, RequestFailed):
            self._deliver(message.request_id, message)
        elif isinstance(message, SchedulerReady):
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message)

    def _deliver(self, request_id: int, event: TokenEvent | RequestFailed) -> None:
        pending = self._pending.get(request_id)
        if pending is None:
            return  # forgotten (client went away)
        pending.events.put_nowait(event)
        if isinstance(event, RequestFailed) or event.finished:
            del self._pending[request_id]

    def _on_scheduler_exit(self) -> None:
        if not self.alive:
            return
        self.alive = False
        self._stop_reading()
        self._process.join(0.5)
        logger.error(
            "scheduler process (pid %d) died, exit code %s; failing %d requests",
            self._process.pid,
            self._process.exitcode,
            len(self._pending),
        )
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(
                SchedulerUnavailable("the scheduler died while starting")
            )
        self._fail_all_pending("the scheduler process died")

    def _stop_reading(self) -> None:
        self.alive = False
        with contextlib.suppress(RuntimeError, OSError, ValueError):
            asyncio.get_running_loop().remove_reader(self._connection.fileno())

    def _fail_all_pending(self, reason: str) -> None:
        for request_id, pending in list(self._pending.items()):
            # Segments the scheduler never materialised would otherwise leak.
            release_segments(pending.prepared.payloads)
            pending.events.put_nowait(RequestFailed(request_id, reason))
        self._pending.clear()
