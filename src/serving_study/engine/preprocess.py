"""Qwen3-VL image preprocessing: on the GPU with torch, or on the CPU with numpy.

SGLang runs Qwen3-VL's image processor on the GPU, then, for the cpu feature
transport, copies the result back to host memory (`.cpu()`) before the SHM
copy. `preprocess_image_on_device` does the same with torch on a CUDA device.
Without a GPU, `preprocess_image` stands in with Pillow and numpy, and it
deliberately never calls a torch operator: PyTorch's intra-op thread pool must
be entered only by the SHM copy, so that a thread cap (`OMP_NUM_THREADS`)
changes the copy and nothing else.

The output matches the Hugging Face Qwen2-VL image processor configured as
Qwen3-VL ships it (patch 16, temporal patch 2, merge 2, mean/std 0.5,
256² to 4096² pixels): `pixel_values` float32 of shape
(grid_h · grid_w, 3 · 2 · 16 · 16) and `image_grid_thw` [[1, grid_h, grid_w]].
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    import torch

PATCH_SIZE = 16
TEMPORAL_PATCH_SIZE = 2
MERGE_SIZE = 2
RESIZE_FACTOR = PATCH_SIZE * MERGE_SIZE
MIN_PIXELS = 65_536
MAX_PIXELS = 16_777_216
IMAGE_MEAN = 0.5
IMAGE_STD = 0.5
CHANNELS = 3
PATCH_VALUES = CHANNELS * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE
MAX_ASPECT_RATIO = 200


@dataclass(frozen=True)
class ImageFeatures:
    """What the processor hands the model for one image."""

    pixel_values: np.ndarray
    image_grid_thw: np.ndarray

    @property
    def llm_image_tokens(self) -> int:
        return llm_image_tokens(self.image_grid_thw)


def llm_image_tokens(image_grid_thw: np.ndarray) -> int:
    """Tokens an image takes in the prompt after the 2x2 merge."""
    return int(np.prod(image_grid_thw[0])) // (MERGE_SIZE * MERGE_SIZE)


def decode_image(data: bytes) -> Image.Image:
    """Decode PNG/JPEG bytes to RGB; raise ValueError if Pillow cannot read them."""
    try:
        image = Image.open(io.BytesIO(data))
        return image.convert("RGB")
    except (OSError, Image.DecompressionBombError, SyntaxError) as error:
        raise ValueError(f"cannot decode the image: {error}") from error


def smart_resize(height: int, width: int) -> tuple[int, int]:
    """Nearest size with both sides multiples of RESIZE_FACTOR and area in bounds."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"image of {width}x{height} px has an aspect ratio above "
            f"{MAX_ASPECT_RATIO}, which Qwen3-VL refuses"
        )
    factor = RESIZE_FACTOR
    resized_height = max(factor, round(height / factor) * factor)
    resized_width = max(factor, round(width / factor) * factor)
    if resized_height * resized_width > MAX_PIXELS:
        scale = math.sqrt(height * width / MAX_PIXELS)
        resized_height = max(factor, math.floor(height / scale / factor) * factor)
        resized_width = max(factor, math.floor(width / scale / factor) * factor)
    elif resized_height * resized_width < MIN_PIXELS:
        scale = math.sqrt(MIN_PIXELS / (height * width))
        resized_height = math.ceil(height * scale / factor) * factor
        resized_width = math.ceil(width * scale / factor) * factor
    return resized_height, resized_width


def feature_bytes(height: int, width: int) -> int:
    """Bytes of one image's pixel_values: float32, (h/16 * w/16) rows of 1536."""
    height, width = smart_resize(height, width)
    return (height // 16) * (width // 16) * 1536 * 4


def merge_block_shape(grid_height: int, grid_width: int) -> tuple[int, ...]:
    """Channel-first pixels viewed as 2x2 blocks of patches. Axes: channel, block
    row, row in block, pixel row, block column, column in block, pixel column."""
    block_rows = (grid_height // MERGE_SIZE, MERGE_SIZE, PATCH_SIZE)
    block_columns = (grid_width // MERGE_SIZE, MERGE_SIZE, PATCH_SIZE)
    return (CHANNELS, *block_rows, *block_columns)


def preprocess_image(image: Image.Image) -> ImageFeatures:
    """Resize, normalise and cut one RGB image into Qwen3-VL patch rows."""
    height, width = smart_resize(image.height, image.width)
    if (height, width) != (image.height, image.width):
        image = image.resize((width, height), Image.Resampling.BICUBIC)
    # Channel-first, so each patch row's 16 pixels are contiguous in memory.
    pixels = np.asarray(image).transpose(2, 0, 1).astype(np.float32)
    pixels *= 1 / 255
    pixels -= IMAGE_MEAN
    pixels /= IMAGE_STD

    grid_height, grid_width = height // PATCH_SIZE, width // PATCH_SIZE
    blocks = pixels.reshape(merge_block_shape(grid_height, grid_width))
    # Rows in Qwen2-VL order: block row, block column, row in block, column in
    # block; each row holds channel, frame, pixel row, pixel column.
    ordered = blocks.transpose(1, 4, 2, 5, 0, 3, 6)[:, :, :, :, :, np.newaxis]
    # A still image is the same frame twice (temporal patch of 2).
    frames = np.broadcast_to(
        ordered, ordered.shape[:5] + (TEMPORAL_PATCH_SIZE,) + ordered.shape[6:]
    )
    pixel_values = np.ascontiguousarray(frames).reshape(
        grid_height * grid_width, PATCH_VALUES
    )
    image_grid_thw = np.array([[1, grid_height, grid_width]], dtype=np.int64)
    return ImageFeatures(pixel_values=pixel_values, image_grid_thw=image_grid_thw)


def preprocess_image_on_device(
    image: Image.Image, device: str
) -> tuple[torch.Tensor, np.ndarray]:
    """The same rows as `preprocess_image`, computed with torch on ``device``.

    Returns ``(pixel_values, image_grid_thw)`` with ``pixel_values`` left on
    ``device``. The decoded pixels travel as uint8 (a quarter of the float32
    bytes) and are resized there, as the fast Qwen2-VL processor does.
    """
    import torch
    from torch.nn import functional

    height, width = smart_resize(image.height, image.width)
    pixels = torch.from_numpy(np.array(image)).to(device)
    pixels = pixels.permute(2, 0, 1).to(torch.float32)
    if (height, width) != (image.height, image.width):
        pixels = functional.interpolate(
            pixels[None],
            size=(height, width),
            mode="bicubic",
            align_corners=False,
            antialias=True,
        )[0].clamp_(0, 255)
    pixels = (pixels * (1 / 255) - IMAGE_MEAN) / IMAGE_STD

    grid_height, grid_width = height // PATCH_SIZE, width // PATCH_SIZE
    blocks = pixels.reshape(merge_block_shape(grid_height, grid_width))
    ordered = blocks.permute(1, 4, 2, 5, 0, 3, 6).unsqueeze(5)
    frames = ordered.expand(
        ordered.shape[:5] + (TEMPORAL_PATCH_SIZE,) + ordered.shape[6:]
    )
    pixel_values = frames.reshape(grid_height * grid_width, PATCH_VALUES)
    image_grid_thw = np.array([[1, grid_height, grid_width]], dtype=np.int64)
    return pixel_values, image_grid_thw
