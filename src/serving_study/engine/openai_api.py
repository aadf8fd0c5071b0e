"""The OpenAI chat-completions format, as SGLang speaks it: parsing and chunks.

Pure functions: a request body in, a `ChatRequest` out (or `BadRequest`);
token counts in, response dictionaries out. The stream follows SGLang's
`serving_chat.py`: a first chunk with role "assistant" and empty content,
one chunk per token, a finish chunk, a usage chunk with no choices when
`stream_options.include_usage` is set, then `[DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

DEFAULT_MAX_TOKENS = 32
DATA_URL_BASE64_MARKER = ";base64,"
# Stand-in text: one word per generated token.
WORDS = ("the", "image", "shows", "a", "scene", "with", "several", "objects")
# <|vision_start|> and <|vision_end|> around each image's tokens.
TOKENS_AROUND_IMAGE = 2


class BadRequest(ValueError):
    """The request cannot be served as sent (HTTP 400)."""


@dataclass(frozen=True)
class ChatRequest:
    images_base64: tuple[str, ...]
    text: str
    max_tokens: int
    stream: bool
    include_usage: bool
    model: str | None


@dataclass
class CompletionIdentity:
    """What every chunk of one response repeats."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))


def parse_chat_request(body: object) -> ChatRequest:
    """Validate an OpenAI chat-completions body; raise BadRequest if unusable."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    images: list[str] = []
    texts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        if not isinstance(content, list):
            raise BadRequest("message 'content' must be a string or a list of parts")
        for part in content:
            _collect_part(part, images, texts)
    if not images:
        raise BadRequest(
            "no image in the request: this engine serves image chat requests; "
            "add a content part {'type': 'image_url', 'image_url': {'url': "
            "'data:image/png;base64,...'}}"
        )
    stream_options = body.get("stream_options") or {}
    return ChatRequest(
        images_base64=tuple(images),
        text=" ".join(texts),
        max_tokens=_max_tokens(body),
        stream=bool(body.get("stream", False)),
        include_usage=bool(
            isinstance(stream_options, dict) and stream_options.get("include_usage")
        ),
        model=body.get("model"),
    )


def _collect_part(part: object, images: list[str], texts: list[str]) -> None:
    if not isinstance(part, dict):
        raise BadRequest("each content part must be an object")
    kind = part.get("type")
    if kind == "text":
        texts.append(str(part.get("text", "")))
    elif kind == "image_url":
        image_url = part.get("image_url")
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
        if not isinstance(url, str):
            raise BadRequest("image_url needs a 'url' string")
        images.append(_base64_of_data_url(url))
    else:
        raise BadRequest(f"content part type {kind!r} is not supported")


def _base64_of_data_url(url: str) -> str:
    if not url.startswith("data:") or DATA_URL_BASE64_MARKER not in url:
        raise BadRequest(
            "image URLs must be base64 data URLs (data:image/png;base64,...); "
            "this engine fetches nothing over the network"
        )
    return url.split(DATA_URL_BASE64_MARKER, 1)[1]


def _max_tokens(body: dict) -> int:
    value = body.get("max_completion_tokens")
    if value is None:
        value = body.get("max_tokens")
    if value is None:
        return DEFAULT_MAX_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(
            f"max_completion_tokens must be a positive integer, not {value!r}"
        )
    return value


def token_text(token_index: int) -> str:
    return " " + WORDS[token_index % len(WORDS)]


def prompt_token_count(text: str, image_tokens: list[int]) -> int:
    """Approximate prompt length: one token per word plus each image's tokens."""
    return len(text.split()) + sum(
        tokens + TOKENS_AROUND_IMAGE for tokens in image_tokens
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def stream_chunk(
    identity: CompletionIdentity, delta: dict, finish_reason: str | None = None
) -> dict:
    choice = dict(index=0, delta=delta, logprobs=None, finish_reason=finish_reason)
    return _response(identity, "chat.completion.chunk", choices=[choice])


def usage_chunk(identity: CompletionIdentity, usage_counts: dict) -> dict:
    return _response(identity, "chat.completion.chunk", choices=[], usage=usage_counts)


def completion(identity: CompletionIdentity, text: str, usage_counts: dict) -> dict:
    message = {"role": "assistant", "content": text}
    choice = dict(index=0, message=message, logprobs=None, finish_reason="length")
    return _response(identity, "chat.completion", choices=[choice], usage=usage_counts)


def _response(identity: CompletionIdentity, kind: str, **fields) -> dict:
    """What every response and chunk starts with, then ``fields``."""
    return {
        "id": identity.id,
        "object": kind,
        "created": identity.created,
        "model": identity.model,
        **fields,
    }


def error_body(message: str, status: int) -> dict:
    kind = "BadRequestError" if status == 400 else "InternalServerError"
    return {"object": "error", "message": message, "type": kind, "code": status}


def sse_event(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()
