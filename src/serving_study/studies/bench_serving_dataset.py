"""An arm's workload as SGLang bench_serving's ``openai`` dataset: our requests, as
our client sends them, in the order it sends its measured ones.

bench_serving 0.5.23 (``sglang.benchmark.datasets.openai_dataset``) reads a JSONL
file of chat requests: each line's ``messages`` go into the request as they are,
``max_tokens`` becomes its ``max_completion_tokens``, and every other key but
``model`` is added to the body. It reads the first ``--num-prompts`` lines in
file order and never shuffles them. Its own request adds ``stream``,
``temperature: 0`` and ``ignore_eos: true``, as ours does, so a line carrying our
messages (the image as the same base64 data URL, then the prompt), our output
tokens and our ``stream_options`` makes the very body our client sends.

Our client sends request ``i`` with image ``i mod n`` and its first
``warmup_requests`` indices are the warm-up, so line ``j`` is image
``(warmup_requests + j) mod n``: bench_serving's measured requests are ours, one
for one. Its warm-up sends the first line ``warmup_requests`` times (with at most
32 output tokens) instead of our first ``warmup_requests`` images.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from serving_study.measure.chat_requests import ChatRequest, load_requests

# What our client's body holds besides the messages, the model and the output
# tokens, and bench_serving's does not add itself (chat_requests.ChatRequest.body).
STREAM_OPTIONS = {"stream_options": {"include_usage": True}}


def measured_order(
    requests: list[ChatRequest], warmup_requests: int, measured_requests: int
) -> list[ChatRequest]:
    """Our client's measured requests, in the order it sends them."""
    return [
        requests[(warmup_requests + index) % len(requests)]
        for index in range(measured_requests)
    ]


def dataset_line(request: ChatRequest, output_tokens: int) -> bytes:
    """One line of the dataset: the request's messages as our client encodes them."""
    settings = {"max_tokens": output_tokens, **STREAM_OPTIONS}
    head = json.dumps(settings, separators=(",", ":")).encode()
    return b'{"messages":' + request.messages_json + b"," + head[1:] + b"\n"


def write_dataset(
    manifest: Path,
    path: Path,
    *,
    warmup_requests: int,
    measured_requests: int,
    output_tokens: int,
) -> dict:
    """Write the dataset for a run of ``measured_requests`` after our client's
    ``warmup_requests``; return what it holds (its lines, images and sha256)."""
    order = measured_order(load_requests(manifest), warmup_requests, measured_requests)
    digest = hashlib.sha256()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as dataset:
        for request in order:
            line = dataset_line(request, output_tokens)
            dataset.write(line)
            digest.update(line)
    return {
        "format": "bench_serving --dataset-name openai (JSONL)",
        "lines": measured_requests,
        "output_tokens": output_tokens,
        "distinct_images": len({request.image_file for request in order}),
        # bench_serving warms up on its first line (our first measured image).
        "warmup_image": order[0].image_file,
        "sha256": digest.hexdigest(),
    }
