"""The engine's main process: an OpenAI-compatible HTTP server (aiohttp).

It plays SGLang's main process (HTTP server plus TokenizerManager): each request's
images go through `request_path` to the spawned scheduler, whose tokens stream back
as server-sent events. Like SGLang it sets no process title, and it calls
`torch.set_num_threads` only when `--intra-op-threads` asks. `/health` answers 503
until a built-in warm-up image request has gone through the whole path, then 200;
the log then says SGLang's "The server is fired up and ready to roll!".
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import os
import platform
import signal
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from aiohttp import web
from PIL import Image

from serving_study.engine import openai_api
from serving_study.engine.engine_config import EngineConfig
from serving_study.engine.openai_api import BadRequest, CompletionIdentity
from serving_study.engine.protocol import CUDA_IPC_TRANSPORT
from serving_study.engine.request_path import InvalidImage, RequestPath
from serving_study.engine.scheduler import EarlyScheduler
from serving_study.engine.scheduler_client import (
    GenerationFailed,
    PendingRequest,
    SchedulerClient,
    SchedulerUnavailable,
)
from serving_study.engine.segments import release_segments
from serving_study.engine.shm_loader import VariantTransport, load_variant_transport

READY_LINE = "The server is fired up and ready to roll!"
THREAD_ENV_PREFIXES = ("OMP_", "MKL_", "GOMP_", "KMP_", "OPENBLAS_")
WARMUP_IMAGE_SIZE = 512
WARMUP_OUTPUT_TOKENS = 4
SSE_DONE = openai_api.sse_event("[DONE]")

logger = logging.getLogger("serving_study.engine.server")


class EngineStartFailed(RuntimeError):
    pass


class Engine:
    """HTTP handlers plus the request path and the scheduler they drive."""

    def __init__(
        self,
        config: EngineConfig,
        variant: VariantTransport,
        early_scheduler: EarlyScheduler | None = None,
    ) -> None:
        self.config = config
        self.variant = variant
        self.preprocess_device = resolved_preprocess_device(config.preprocess_device)
        self.request_path = RequestPath(
            variant.shm_pointer_class, config.transport, self.preprocess_device
        )
        self.scheduler = SchedulerClient(
            config.scheduler_settings(variant.mm_utils_sha256), early_scheduler
        )
        self.healthy = False
        self.app = web.Application(client_max_size=1024**3)
        self.app.add_routes(
            [
                web.get("/health", self.health),
                web.get("/v1/models", self.models),
                web.get("/server_info", self.server_info),
                web.post("/v1/chat/completions", self.chat_completions),
            ]
        )

    async def start(self) -> None:
        """Start the scheduler, run the warm-up request, then report healthy."""
        try:
            ready = await self.scheduler.start(self.config.startup_timeout_s)
            logger.info(
                "scheduler ready (pid %d, torch threads %d, receive path %s)",
                ready.pid,
                ready.torch_num_threads,
                ready.receive_path,
            )
            await self._warm_up()
        except (SchedulerUnavailable, GenerationFailed) as error:
            raise EngineStartFailed(f"engine start failed: {error}") from error
        self.healthy = True
        logger.info(READY_LINE)

    def stop(self) -> None:
        self.healthy = False
        self.scheduler.stop()

    async def _warm_up(self) -> None:
        prepared = self.request_path.prepare((_warmup_image_base64(),))
        pending = self._submit(prepared, WARMUP_OUTPUT_TOKENS)
        try:
            async for _ in pending.tokens():
                pass
        finally:
            self.scheduler.forget(pending)
        logger.info("warm-up image request went through the whole request path")

    def _submit(self, prepared, output_tokens: int) -> PendingRequest:
        try:
            return self.scheduler.submit(prepared, output_tokens)
        except SchedulerUnavailable:
            release_segments(prepared.payloads)
            raise

    async def health(self, request: web.Request) -> web.Response:
        if not self.scheduler.alive and self.scheduler.ready_message is not None:
            return web.json_response({"status": "scheduler died"}, status=503)
        if not self.healthy:
            return web.json_response({"status": "starting"}, status=503)
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        name = self.config.served_model_name
        model = dict(id=name, object="model", owned_by="serving_study", root=name)
        return web.json_response({"object": "list", "data": [model]})

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.describe())

    def describe(self) -> dict:
        ready = self.scheduler.ready_message
        return {
            "pid": os.getpid(),
            "scheduler_pid": self.scheduler.pid,
            "scheduler_alive": self.scheduler.alive,
            "scheduler_torch_num_threads": ready.torch_num_threads if ready else None,
            "scheduler_receive_path": ready.receive_path if ready else None,
            "torch_num_threads": torch.get_num_threads(),
            "thread_env": {
                name: value
                for name, value in sorted(os.environ.items())
                if name.startswith(THREAD_ENV_PREFIXES)
            },
            "cgroup": _cgroup_lines(),
            "cpu_count": os.cpu_count(),
            "cpu_affinity_count": len(os.sched_getaffinity(0)),
            "transport": self.config.transport,
            "preprocess_device": self.preprocess_device,
            "intra_op_threads_forced": self.config.intra_op_threads,
            "gpu_name": (
                torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
            ),
            "served_model_name": self.config.served_model_name,
            "timing": asdict(self.config.timing),
            "sglang_source": str(self.config.sglang_source),
            "mm_utils_path": str(self.variant.mm_utils_path),
            "mm_utils_sha256": self.variant.mm_utils_sha256,
            "shm_pointer_free_names": list(self.variant.free_names),
            "request_path": asdict(self.request_path.timings),
            "inline_fallbacks": self.request_path.inline_fallbacks,
            "python_version": platform.python_version(),
            "torch_version": torch.__version__,
            "launch_command": sys.argv,
        }

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            chat = openai_api.parse_chat_request(await request.json())
            # On the event-loop thread, as SGLang's TokenizerManager does it.
            prepared = self.request_path.prepare(chat.images_base64)
        except json.JSONDecodeError as error:
            return _error_response(f"the body is not valid JSON: {error}", 400)
        except (BadRequest, InvalidImage) as error:
            return _error_response(str(error), 400)
        try:
            pending = self._submit(prepared, chat.max_tokens)
        except SchedulerUnavailable as error:
            return _error_response(str(error), 500)
        identity = CompletionIdentity(model=chat.model or self.config.served_model_name)
        prompt_tokens = openai_api.prompt_token_count(chat.text, prepared.image_tokens)
        try:
            if chat.stream:
                return await self._stream(
                    request, chat, pending, identity, prompt_tokens
                )
            return await self._complete(pending, identity, prompt_tokens)
        finally:
            self.scheduler.forget(pending)

    async def _complete(
        self, pending: PendingRequest, identity: CompletionIdentity, prompt_tokens: int
    ) -> web.Response:
        try:
            texts = [
                openai_api.token_text(e.token_index) async for e in pending.tokens()
            ]
        except GenerationFailed as error:
            return _error_response(str(error), 500)
        body = openai_api.completion(
            identity, "".join(texts), openai_api.usage(prompt_tokens, len(texts))
        )
        return web.json_response(body)

    async def _stream(
        self,
        request: web.Request,
        chat: openai_api.ChatRequest,
        pending: PendingRequest,
        identity: CompletionIdentity,
        prompt_tokens: int,
    ) -> web.StreamResponse:
        tokens = pending.tokens()
        try:
            # Headers wait for the first token, so a dead scheduler is a 500.
            first = await anext(tokens)
        except GenerationFailed as error:
            return _error_response(str(error), 500)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        role = openai_api.stream_chunk(identity, {"role": "assistant", "content": ""})
        completion_tokens = 0
        try:
            await response.write(
                openai_api.sse_event(role) + self._token_event(identity, first)
            )
            completion_tokens = 1
            async for event in tokens:
                await response.write(self._token_event(identity, event))
                completion_tokens += 1
            finish = openai_api.stream_chunk(identity, {}, finish_reason="length")
            tail = openai_api.sse_event(finish)
            if chat.include_usage:
                counts = openai_api.usage(prompt_tokens, completion_tokens)
                tail += openai_api.sse_event(openai_api.usage_chunk(identity, counts))
            await response.write(tail + SSE_DONE)
        except GenerationFailed as error:
            error_chunk = {"error": openai_api.error_body(str(error), 500)}
            await response.write(openai_api.sse_event(error_chunk))
        except ConnectionResetError:
            logger.info("client went away after %d tokens", completion_tokens)
            return response
        await response.write_eof()
        return response

    @staticmethod
    def _token_event(identity: CompletionIdentity, event) -> bytes:
        delta = {"content": openai_api.token_text(event.token_index)}
        return openai_api.sse_event(openai_api.stream_chunk(identity, delta))


def resolved_preprocess_device(requested: str) -> str:
    """cpu or cuda; auto picks the GPU when torch sees one."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def run_engine(
    config: EngineConfig, early_scheduler: EarlyScheduler | None = None
) -> int:
    """Run the engine until SIGTERM/SIGINT; return the process exit code.

    ``early_scheduler`` is a scheduler process the command line already started
    (so that it loads torch while this process does)."""
    logging.basicConfig(
        level=logging.INFO,
        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
    if config.transport == CUDA_IPC_TRANSPORT and not torch.cuda.is_available():
        logger.error(
            "transport cuda_ipc needs a CUDA GPU; use transport: cpu on this host"
        )
        return 2
    if config.preprocess_device == "cuda" and not torch.cuda.is_available():
        logger.error(
            "preprocess device cuda needs a CUDA GPU; use preprocess_device: auto "
            "or cpu on this host"
        )
        return 2
    if config.intra_op_threads is not None:
        torch.set_num_threads(config.intra_op_threads)
        logger.info("intra-op threads forced to %d", torch.get_num_threads())
    variant = load_variant_transport(config.sglang_source)
    logger.info(
        "loaded ShmPointerMMData from %s (sha256 %s)",
        variant.mm_utils_path,
        variant.mm_utils_sha256,
    )
    return asyncio.run(_serve(Engine(config, variant, early_scheduler)))


async def _serve(engine: Engine) -> int:
    config = engine.config
    runner = web.AppRunner(engine.app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    logger.info("listening on http://%s:%d", config.host, config.port)

    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop_requested.set)

    exit_code = 0
    startup = asyncio.create_task(engine.start())
    stop_wait = asyncio.create_task(stop_requested.wait())
    try:
        await asyncio.wait({startup, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if startup.done():
            startup.result()
            await stop_wait
        logger.info("stop requested; shutting down")
    except EngineStartFailed as error:
        logger.error("%s", error)
        exit_code = 1
    finally:
        startup.cancel()
        stop_wait.cancel()
        await site.stop()
        engine.stop()
        await runner.cleanup()
    logger.info("engine stopped")
    return exit_code


def _error_response(message: str, status: int) -> web.Response:
    return web.json_response(openai_api.error_body(message, status), status=status)


def _cgroup_lines() -> list[str]:
    try:
        return Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []


def _warmup_image_base64() -> str:
    """A small PNG gradient, like SGLang's built-in warm-up image."""
    ramp = np.linspace(0, 255, WARMUP_IMAGE_SIZE, dtype=np.uint8)
    pixels = np.stack(np.broadcast_arrays(ramp[:, None], ramp[None, :], 128), axis=-1)
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()
