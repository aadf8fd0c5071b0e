"""The requests a workload makes: one streaming chat request per image.

The workload manifest (JSON, written by `workloads.py`) names a prompt and a list of
images relative to the manifest's directory. `load_requests` reads and checks every
image and pre-encodes its chat message (base64 data URL) once, so that the load
client can build complete request bodies before its clock starts.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

IMAGE_MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "jpg": "image/jpeg"}
JSON = "application/json"  # the content type of a request body


@dataclass(frozen=True)
class ChatRequest:
    """One image and the prompt, with its chat message already JSON-encoded."""

    image_file: str  # as named in the manifest, relative to the manifest's directory
    messages_json: bytes  # the encoded value of the body's "messages" field

    def body(self, *, model: str, output_tokens: int) -> bytes:
        """The complete JSON body of a streaming chat-completions request."""
        settings = {
            "model": model,
            "max_completion_tokens": output_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        head = json.dumps(settings, separators=(",", ":")).encode()
        # Splice the encoded messages in: re-encoding megabytes of base64 is slow.
        return head[:-1] + b',"messages":' + self.messages_json + b"}"


def load_requests(manifest_path: Path) -> list[ChatRequest]:
    """One ChatRequest per manifest image, in manifest order; checks every sha256."""
    manifest_path = Path(manifest_path)
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    prompt = manifest["prompt"]
    if not manifest.get("images"):
        raise ValueError(f"Workload manifest {manifest_path} lists no images.")
    chat_requests = []
    for image in manifest["images"]:
        path = manifest_path.parent / image["file"]
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != image["sha256"]:
            raise ValueError(
                f"Image {path} has sha256 {digest}, the manifest says "
                f"{image['sha256']}: the workload changed after it was written. "
                "Regenerate the workload."
            )
        media_type = IMAGE_MEDIA_TYPES.get(image["format"])
        if media_type is None:
            raise ValueError(
                f"Image {path} has format {image['format']!r}; the client sends "
                f"{sorted(IMAGE_MEDIA_TYPES)}."
            )
        url = f"data:{media_type};base64,".encode() + base64.b64encode(data)
        chat_requests.append(ChatRequest(image["file"], messages_json(url, prompt)))
    return chat_requests


def messages_json(image_url: bytes, prompt: str) -> bytes:
    """The JSON of one user message with an image URL and the prompt.

    A data URL needs no escaping in JSON (base64 and its prefix are plain ASCII),
    so it is spliced in as bytes: JSON-encoding megabytes of base64 would scan every
    character, which took most of the time of loading a workload.
    """
    placeholder = "\0image-url\0"
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": placeholder}},
                {"type": "text", "text": prompt},
            ],
        }
    ]
    head, tail = json.dumps(messages, separators=(",", ":")).split(
        json.dumps(placeholder)
    )
    return b'%s"%s"%s' % (head.encode(), image_url, tail.encode())
