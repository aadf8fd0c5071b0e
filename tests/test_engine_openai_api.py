"""Parsing OpenAI chat requests the way the engine accepts them."""

from __future__ import annotations

import pytest

from serving_study.engine.openai_api import (
    DEFAULT_MAX_TOKENS,
    BadRequest,
    parse_chat_request,
)

IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}


def _body(content, **fields) -> dict:
    return {"messages": [{"role": "user", "content": content}], **fields}


def test_sglang_benchmark_request_is_understood():
    chat = parse_chat_request(
        _body(
            [IMAGE_PART, {"type": "text", "text": "describe"}],
            model="m",
            max_completion_tokens=32,
            stream=True,
            ignore_eos=True,
            temperature=0,
            stream_options={"include_usage": True},
        )
    )
    assert chat.images_base64 == ("QUJD",)
    assert chat.text == "describe"
    assert chat.max_tokens == 32
    assert chat.stream and chat.include_usage
    assert chat.model == "m"


def test_max_tokens_falls_back_to_the_legacy_field_then_a_default():
    assert parse_chat_request(_body([IMAGE_PART], max_tokens=7)).max_tokens == 7
    assert parse_chat_request(_body([IMAGE_PART])).max_tokens == DEFAULT_MAX_TOKENS


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "JSON object"),
        ({"messages": []}, "non-empty list"),
        (_body("text only"), "no image"),
        (_body([IMAGE_PART], max_completion_tokens=0), "positive integer"),
        (
            _body([{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]),
            "base64 data URLs",
        ),
        (_body([{"type": "video_url", "video_url": {}}]), "not supported"),
    ],
)
def test_unusable_requests_are_refused_with_a_reason(body, message):
    with pytest.raises(BadRequest, match=message):
        parse_chat_request(body)
