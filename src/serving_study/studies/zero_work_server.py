"""An OpenAI-style chat server that does no work: the load client's roofline.

`python -m serving_study.studies.zero_work_server --port N [--tokens 32] [--cpu K]`
answers every `POST /v1/chat/completions` with a complete streamed answer at once: it
reads the whole request body (the client still has to send its image), then writes the
role chunk, `--tokens` token chunks, the finish and usage chunks and `[DONE]` in one
write, framed exactly as the embedded engine frames them (chunked SSE, the chunks of
`engine/openai_api.py`). Nothing is decoded or computed per request, so a client
measured against it measures itself.

`--cpu K` pins the server to CPU K, so that a client pinned elsewhere does not
share a core with it. `GET /health` answers 200 once the server listens.
"""

import argparse
import asyncio
import os
import signal
import sys

from aiohttp import web

from serving_study.engine import openai_api

MODEL = "zero-work"
STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def complete_stream(tokens: int) -> bytes:
    """Every SSE event of one streamed answer of `tokens` tokens, as one byte string."""
    identity = openai_api.CompletionIdentity(model=MODEL)
    role = {"role": "assistant", "content": ""}
    events = [openai_api.sse_event(openai_api.stream_chunk(identity, role))]
    for index in range(tokens):
        delta = {"content": openai_api.token_text(index)}
        events.append(openai_api.sse_event(openai_api.stream_chunk(identity, delta)))
    finish = openai_api.stream_chunk(identity, {}, finish_reason="length")
    counts = openai_api.usage(prompt_tokens=0, completion_tokens=tokens)
    events.append(openai_api.sse_event(finish))
    events.append(openai_api.sse_event(openai_api.usage_chunk(identity, counts)))
    events.append(openai_api.sse_event("[DONE]"))
    return b"".join(events)


def make_app(tokens: int) -> web.Application:
    answer = complete_stream(tokens)

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers=STREAM_HEADERS)
        await response.prepare(request)
        await response.write(answer)
        await response.write_eof()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application(client_max_size=1024**3)
    app.add_routes([web.post("/v1/chat/completions", chat), web.get("/health", health)])
    return app


async def serve(host: str, port: int, tokens: int) -> None:
    """Serve until SIGTERM or SIGINT."""
    runner = web.AppRunner(make_app(tokens), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop_requested.set)
    try:
        await stop_requested.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serving_study.studies.zero_work_server",
        description="A streaming chat server that answers at once and does no work.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--cpu", type=int, help="pin the server to this CPU")
    arguments = parser.parse_args(argv)
    if arguments.tokens < 1:
        parser.error(f"--tokens must be at least 1, got {arguments.tokens}")
    if arguments.cpu is not None:
        os.sched_setaffinity(0, {arguments.cpu})
    asyncio.run(serve(arguments.host, arguments.port, arguments.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
