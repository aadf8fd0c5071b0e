"""Generate a seeded multimodal workload: image files, one prompt, and a manifest.

The same spec gives byte-identical files on any machine with the pinned numpy and
Pillow wheels (Pillow's bundled zlib-ng and libjpeg-turbo do the encoding): every
image is drawn from its own generator seeded by (seed, index), only integer
arithmetic shapes the pixels, and the encoders run with fixed parameters and write
no metadata or timestamps. The manifest records the sha256 of every file so a
later step (or Snakemake's ``ensure(sha256=...)``) can check that.

The prompt has as many words as the spec's ``input_tokens``, drawn from common short
English words that byte-pair tokenizers such as Qwen's keep as one token each when
preceded by a space. No tokenizer is loaded, so the count is an approximation of the
text's token count; the chat template and the image's own tokens come on top of it.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import PIL
from PIL import Image, features

from serving_study.config.validation import key_problems
from serving_study.files import file_sha256, staged_directory, write_json

# The file extension of each image format the schema allows (a test keeps the two
# equal).
FORMATS = {"png": "png", "jpeg": "jpg"}

# Keeps the prompt's random stream and the requests' arrival times
# (measure/arrivals.py) apart from the images' (seed, 0, index) streams.
IMAGE_STREAM = 0
PROMPT_STREAM = 1
ARRIVAL_STREAM = 2

# Common English words, each one token with a leading space in Qwen-style tokenizers.
PROMPT_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his "
    "from at which but have an had they you were their one all we can her has there "
    "been if more when will would who so no she other its may these about than them "
    "some time into only new first after most also made over such like years well "
    "water light house city river road tree stone paper table window garden music "
    "color story money world child family school market north south summer winter "
    "morning evening green blue small large old long short high low early late good "
    "great open clear quiet simple people place day year way work life hand part "
    "word name line side head home face door book food car plan idea group point "
    "number area field power state level order form rule case fact view kind sense"
).split()


def generate_workload(spec: dict, out_dir: Path) -> dict:
    """Write ``out_dir/images/*`` and ``out_dir/manifest.json``; return the manifest.

    ``out_dir`` appears complete or not at all: it is built beside itself and renamed
    into place, replacing an older one.
    """
    spec = normalized_spec(spec)
    extension = FORMATS[spec["format"]]
    with staged_directory(Path(out_dir)) as staging:
        images_dir = staging / "images"
        images_dir.mkdir()
        images = []
        for index in range(spec["images"]):
            encoded = encode_image(draw_image(spec, index), spec)
            relative = f"images/{index:06d}.{extension}"
            (staging / relative).write_bytes(encoded)
            images.append(
                {
                    "file": relative,
                    "sha256": file_sha256(staging / relative),
                    "format": spec["format"],
                    "width": spec["width"],
                    "height": spec["height"],
                    "bytes": len(encoded),
                }
            )
        manifest = {
            "name": spec["name"],
            "seed": spec["seed"],
            "prompt": make_prompt(spec["seed"], spec["input_tokens"]),
            "input_tokens": spec["input_tokens"],
            "images": images,
            "spec": spec,
            "generator": {
                "pillow": PIL.__version__,
                "numpy": np.__version__,
                "zlib_ng": features.version("zlib_ng"),
                "libjpeg_turbo": features.version("libjpeg_turbo"),
            },
        }
        write_json(staging / "manifest.json", manifest)
    return manifest


def normalized_spec(spec: dict) -> dict:
    """Return a copy of the spec with the schema's defaults filled in (a config's
    ``workloads`` item); raise ValueError naming every value the schema refuses."""
    spec = dict(spec)
    problems = key_problems(spec, "workloads", root=[f"workloads[{spec.get('name')}]"])
    if problems:
        raise ValueError("; ".join(problems))
    return spec


def draw_image(spec: dict, index: int) -> np.ndarray:
    """Return image ``index`` of a workload as an RGB uint8 array (height, width, 3)."""
    random = np.random.default_rng([spec["seed"], IMAGE_STREAM, index])
    height, width = spec["height"], spec["width"]
    if spec["content"] == "noise":
        return random.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    start, end = random.integers(0, 256, size=(2, 3), dtype=np.int64)
    if spec["content"] == "solid":
        return np.broadcast_to(start.astype(np.uint8), (height, width, 3)).copy()
    # A linear ramp from one colour to another along one of four directions, in
    # integers only so that no platform's floating point can change a pixel.
    step_x, step_y = [(1, 0), (0, 1), (1, 1), (1, -1)][random.integers(0, 4)]
    rows, columns = np.mgrid[0:height, 0:width].astype(np.int64)
    position = columns * step_x + rows * step_y
    position -= position.min()
    span = max(int(position.max()), 1)
    ramp = start + (end - start) * position[..., None] // span
    return ramp.astype(np.uint8)


def encode_image(pixels: np.ndarray, spec: dict) -> bytes:
    """Encode pixels as the spec's format with fixed parameters and no metadata."""
    image = Image.fromarray(pixels)
    stream = io.BytesIO()
    if spec["format"] == "png":
        image.save(stream, format="PNG", compress_level=6, optimize=False)
    else:
        image.save(
            stream,
            format="JPEG",
            quality=spec["jpeg_quality"],
            subsampling="4:2:0",
            optimize=False,
            progressive=False,
        )
    return stream.getvalue()


def make_prompt(seed: int, words: int) -> str:
    """Return ``words`` common words drawn by a generator seeded with ``seed``."""
    random = np.random.default_rng([seed, PROMPT_STREAM])
    picks = random.integers(0, len(PROMPT_WORDS), size=words)
    return " ".join(PROMPT_WORDS[pick] for pick in picks)
