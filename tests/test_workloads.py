"""Seeded workloads: pinned bytes, lossless pixels, no metadata, atomic output."""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest
from PIL import Image

from serving_study import workloads
from serving_study.config.schema import property_schema
from serving_study.files import file_sha256
from serving_study.workloads import PROMPT_WORDS, draw_image, generate_workload

CONTENTS = property_schema("workloads", "content")["enum"]

TINY_PNG = {
    "name": "tiny-png",
    "seed": 7,
    "images": 3,
    "width": 64,
    "height": 64,
    "format": "png",
    "content": "noise",
    "input_tokens": 12,
}
TINY_JPEG = {**TINY_PNG, "name": "tiny-jpeg", "images": 2}
TINY_JPEG.update(format="jpeg", content="gradient")

# Measured with numpy 2.4.6 and Pillow 13.0.0 (zlib-ng 2.3.3, libjpeg-turbo 3.2.0).
PINNED_SHA256 = {
    "tiny-png": [
        "7c76fe9847a4795d9082d4ad6817601785299845216240816cf6aea9878598df",
        "3b10b3733277a56a992794a3e2a0833002796ed9aca7859aedfbc5c038059f96",
        "7832802c0ce58d6d4eeea64614992e567ea8e5fc4e54e573ddfd7cf69f3c0477",
    ],
    "tiny-jpeg": [
        "ee9970767d2072e854d4cd419209ddd105c92d24b3de89ee0bfafc8e7ae8d31a",
        "6975fd31a3b24e74a62bfb44a3233586c67f9acdb485892ad13f2b91318ce658",
    ],
}
PINNED_PROMPT = "food day car this been they all but garden over child road"


@pytest.mark.parametrize("spec", [TINY_PNG, TINY_JPEG], ids=["png", "jpeg"])
def test_a_tiny_workload_has_pinned_bytes(spec, tmp_path):
    manifest = generate_workload(spec, tmp_path / spec["name"])

    assert [image["sha256"] for image in manifest["images"]] == PINNED_SHA256[
        spec["name"]
    ]
    assert manifest["prompt"] == PINNED_PROMPT
    for image in manifest["images"]:
        path = tmp_path / spec["name"] / image["file"]
        assert file_sha256(path) == image["sha256"]
        assert path.stat().st_size == image["bytes"]
        with Image.open(path) as opened:
            assert opened.format == spec["format"].upper()
            assert opened.size == (spec["width"], spec["height"])
    written = json.loads((tmp_path / spec["name"] / "manifest.json").read_text())
    assert written == manifest


def test_the_manifest_lists_files_spec_and_generator(tmp_path):
    manifest = generate_workload(TINY_JPEG, tmp_path / "w")

    assert [image["file"] for image in manifest["images"]] == [
        "images/000000.jpg",
        "images/000001.jpg",
    ]
    assert manifest["spec"] == {**TINY_JPEG, "jpeg_quality": 85}
    assert set(manifest["generator"]) == {"pillow", "numpy", "zlib_ng", "libjpeg_turbo"}
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == [
        "images",
        "manifest.json",
    ]


def test_generating_twice_gives_identical_bytes(tmp_path):
    spec = {**TINY_PNG, "images": 2, "width": 96, "height": 80}
    first = generate_workload(spec, tmp_path / "first")
    second = generate_workload(spec, tmp_path / "second")

    assert first == second
    for image in first["images"]:
        assert (tmp_path / "first" / image["file"]).read_bytes() == (
            tmp_path / "second" / image["file"]
        ).read_bytes()


def test_seed_and_index_each_change_the_image():
    spec = workloads.normalized_spec(TINY_PNG)
    assert not np.array_equal(draw_image(spec, 0), draw_image(spec, 1))
    other_seed = {**spec, "seed": 8}
    assert not np.array_equal(draw_image(spec, 0), draw_image(other_seed, 0))


def test_png_holds_exactly_the_drawn_pixels(tmp_path):
    for content in CONTENTS:
        spec = {**TINY_PNG, "images": 1, "content": content, "width": 40}
        manifest = generate_workload(spec, tmp_path / content)
        with Image.open(tmp_path / content / manifest["images"][0]["file"]) as opened:
            decoded = np.asarray(opened.convert("RGB"))
        expected = draw_image(workloads.normalized_spec(spec), 0)
        assert np.array_equal(decoded, expected), content


def test_a_gradient_runs_between_two_colours():
    spec = workloads.normalized_spec({**TINY_PNG, "content": "gradient"})
    pixels = draw_image(spec, 0).reshape(-1, 3)
    distinct = np.unique(pixels, axis=0)
    assert 2 < len(distinct) <= spec["width"] + spec["height"]


def png_chunk_types(data: bytes) -> list[bytes]:
    types, offset = [], 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        types.append(data[offset + 4 : offset + 8])
        offset += 12 + length
    return types


def test_files_carry_no_metadata(tmp_path):
    png = generate_workload({**TINY_PNG, "images": 1}, tmp_path / "p")
    png_bytes = (tmp_path / "p" / png["images"][0]["file"]).read_bytes()
    assert set(png_chunk_types(png_bytes)) == {b"IHDR", b"IDAT", b"IEND"}

    jpeg = generate_workload({**TINY_JPEG, "images": 1}, tmp_path / "j")
    jpeg_bytes = (tmp_path / "j" / jpeg["images"][0]["file"]).read_bytes()
    assert b"Exif" not in jpeg_bytes and b"\xff\xe1" not in jpeg_bytes


def test_a_512_pixel_noise_png_is_about_its_raw_size(tmp_path):
    spec = {**TINY_PNG, "images": 1, "width": 512, "height": 512}
    manifest = generate_workload(spec, tmp_path / "w")

    raw = 512 * 512 * 3  # 786,432 bytes: noise does not compress
    assert raw <= manifest["images"][0]["bytes"] <= raw * 1.01


def test_one_image_is_the_repeated_image_workload(tmp_path):
    manifest = generate_workload({**TINY_PNG, "images": 1}, tmp_path / "w")
    assert len(manifest["images"]) == 1
    assert len(list((tmp_path / "w" / "images").iterdir())) == 1


def test_the_prompt_has_one_common_word_per_input_token(tmp_path):
    manifest = generate_workload({**TINY_PNG, "input_tokens": 64}, tmp_path / "w")
    words = manifest["prompt"].split(" ")
    assert len(words) == 64 == manifest["input_tokens"]
    assert set(words) <= set(PROMPT_WORDS)
    assert words[:12] == PINNED_PROMPT.split(" ")  # a longer prompt extends a shorter


def test_a_failure_leaves_no_workload_behind(tmp_path, monkeypatch):
    calls = []

    def fail_on_second(pixels, spec):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return b"fake"

    monkeypatch.setattr(workloads, "encode_image", fail_on_second)
    with pytest.raises(OSError, match="disk full"):
        generate_workload(TINY_PNG, tmp_path / "w")
    assert list(tmp_path.iterdir()) == []


def test_a_new_workload_replaces_an_old_one_whole(tmp_path):
    generate_workload(TINY_PNG, tmp_path / "w")
    generate_workload({**TINY_PNG, "images": 1}, tmp_path / "w")

    assert sorted(p.name for p in (tmp_path / "w" / "images").iterdir()) == [
        "000000.png"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]


@pytest.mark.parametrize(
    "change, named",
    [
        ({"format": "gif"}, "workloads[tiny-png].format: 'gif' is not one of"),
        ({"content": "stripes"}, "content: 'stripes' is not one of"),
        ({"images": 0}, "images: 0 is less than the minimum of 1"),
        ({"width": 31}, "width: 31 is less than the minimum of 32"),
        ({"jpeg_quality": 101}, "jpeg_quality: 101 is greater than the maximum of 100"),
        ({"seed": -1}, "seed: -1 is less than the minimum of 0"),
        ({"seed": True}, "seed: True is not of type 'integer'"),
        ({"colour": "red"}, "unknown key 'colour'"),
    ],
)
def test_a_bad_spec_is_named(change, named, tmp_path):
    with pytest.raises(ValueError, match=re.escape(named)):
        generate_workload({**TINY_PNG, **change}, tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_a_spec_missing_a_field_is_named(tmp_path):
    spec = {key: value for key, value in TINY_PNG.items() if key != "width"}
    with pytest.raises(ValueError, match="'width' is a required property"):
        generate_workload(spec, tmp_path / "w")


def test_the_generator_takes_the_schemas_limits_and_defaults():
    """A workload the pre-job check accepts is one the generator runs: it reads
    the config schema rather than keeping limits of its own."""
    minimal = {"name": "w", "images": 1, "width": 32, "height": 32}
    spec = workloads.normalized_spec(minimal)
    assert spec == minimal | {
        key: property_schema("workloads", key)["default"]
        for key in ("seed", "format", "jpeg_quality", "content", "input_tokens")
    }
    assert set(workloads.FORMATS) == set(property_schema("workloads", "format")["enum"])


@pytest.mark.parametrize("quality", ["minimum", "maximum"])
def test_jpeg_quality_at_the_schemas_bounds_encodes(quality, tmp_path):
    value = property_schema("workloads", "jpeg_quality")[quality]
    spec = {**TINY_JPEG, "images": 1, "jpeg_quality": value}
    manifest = generate_workload(spec, tmp_path / "w")
    with Image.open(tmp_path / "w" / manifest["images"][0]["file"]) as opened:
        assert opened.format == "JPEG"
    assert manifest["spec"]["jpeg_quality"] == value
