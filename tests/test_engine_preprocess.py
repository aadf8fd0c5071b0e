"""Qwen3-VL preprocessing: shapes, patch order, resizing, and no torch."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import serving_study
from serving_study.engine.preprocess import (
    MAX_PIXELS,
    MIN_PIXELS,
    decode_image,
    preprocess_image,
    preprocess_image_on_device,
    smart_resize,
)


def _devices() -> list[str]:
    """The CPU always; the GPU where torch sees one (the GPU host)."""
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _random_image(height: int, width: int, seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3))
    return Image.fromarray(pixels.astype(np.uint8))


def _encoded(image: Image.Image, image_format: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("size", "rows", "grid"),
    [(512, 1024, 32), (1024, 4096, 64), (2048, 16384, 128)],
)
def test_square_images_give_qwen3_vl_shapes(size, rows, grid):
    features = preprocess_image(_random_image(size, size))
    assert features.pixel_values.shape == (rows, 1536)
    assert features.pixel_values.dtype == np.float32
    assert features.pixel_values.flags.c_contiguous
    assert features.image_grid_thw.tolist() == [[1, grid, grid]]
    assert features.llm_image_tokens == rows // 4


def test_patch_rows_follow_the_qwen2_vl_order():
    """Compare with a patch-by-patch construction written as plain loops."""
    image = _random_image(256, 384, seed=3)
    normalised = (np.asarray(image, dtype=np.float32) / 255 - 0.5) / 0.5
    expected = []
    for block_row in range(256 // 32):
        for block_column in range(384 // 32):
            for row_in_block in range(2):
                for column_in_block in range(2):
                    top = (block_row * 2 + row_in_block) * 16
                    left = (block_column * 2 + column_in_block) * 16
                    patch = normalised[top : top + 16, left : left + 16, :]
                    values = []
                    for channel in range(3):
                        for _frame in range(2):
                            values.append(patch[:, :, channel].reshape(-1))
                    expected.append(np.concatenate(values))

    features = preprocess_image(image)
    assert features.image_grid_thw.tolist() == [[1, 16, 24]]
    np.testing.assert_allclose(features.pixel_values, np.stack(expected), atol=1e-6)


def test_normalisation_maps_black_and_white_to_minus_and_plus_one():
    black = preprocess_image(Image.new("RGB", (256, 256), (0, 0, 0)))
    white = preprocess_image(Image.new("RGB", (256, 256), (255, 255, 255)))
    assert np.allclose(black.pixel_values, -1.0)
    assert np.allclose(white.pixel_values, 1.0)


@pytest.mark.parametrize("image_format", ["PNG", "JPEG"])
def test_png_and_jpeg_decode_to_rgb(image_format):
    image = decode_image(_encoded(_random_image(300, 200), image_format))
    assert image.mode == "RGB" and image.size == (200, 300)
    grey_png = _encoded(Image.new("L", (64, 64), 7), "PNG")
    assert decode_image(grey_png).mode == "RGB"


def test_bytes_that_are_not_an_image_are_refused():
    with pytest.raises(ValueError, match="cannot decode the image"):
        decode_image(b"hello")


def test_sizes_are_rounded_to_multiples_of_32_within_pixel_limits():
    assert smart_resize(512, 512) == (512, 512)
    assert smart_resize(500, 333) == (512, 320)
    height, width = smart_resize(20, 30)  # below 256x256: scaled up
    assert height * width >= MIN_PIXELS and height % 32 == 0 and width % 32 == 0
    height, width = smart_resize(5000, 5000)  # above 4096x4096: scaled down
    assert height * width <= MAX_PIXELS and height % 32 == 0 and width % 32 == 0
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 3000)


def test_odd_sized_image_is_resized_before_patching():
    features = preprocess_image(_random_image(500, 333))
    assert features.image_grid_thw.tolist() == [[1, 32, 20]]
    assert features.pixel_values.shape == (32 * 20, 1536)


def test_preprocessing_never_imports_torch():
    """The thread cap must change the SHM copy only, not preprocessing."""
    program = (
        "import sys\n"
        "from PIL import Image\n"
        "from serving_study.engine.preprocess import preprocess_image\n"
        "preprocess_image(Image.new('RGB', (512, 512)))\n"
        "assert 'torch' not in sys.modules, 'preprocessing imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True, env=_child_env())


def _child_env() -> dict:
    source_root = str(Path(serving_study.__file__).parents[1])
    python_path = os.pathsep.join(filter(None, [source_root, os.getenv("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": python_path}


@pytest.mark.parametrize("device", _devices())
def test_torch_preprocessing_gives_the_numpy_rows(device):
    """The GPU path computes the same rows; without resizing, bit for bit."""
    image = _random_image(512, 384, seed=5)
    expected = preprocess_image(image)
    pixel_values, grid = preprocess_image_on_device(image, device)
    assert pixel_values.device.type == device
    assert pixel_values.is_contiguous()
    assert grid.tolist() == expected.image_grid_thw.tolist()
    np.testing.assert_allclose(
        pixel_values.cpu().numpy(), expected.pixel_values, rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("device", _devices())
def test_torch_preprocessing_resizes_like_pillow_within_a_few_levels(device):
    image = _random_image(300, 500, seed=6)
    expected = preprocess_image(image)
    pixel_values, grid = preprocess_image_on_device(image, device)
    assert grid.tolist() == expected.image_grid_thw.tolist()
    difference = np.abs(pixel_values.cpu().numpy() - expected.pixel_values)
    # Both are antialiased bicubic resizes; they differ by rounding, not in shape.
    assert difference.mean() < 0.02
