"""The loader compiles the variant's own ShmPointerMMData, patched or not."""

from __future__ import annotations

import hashlib
import inspect
import multiprocessing
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from serving_study.engine.segments import SHM_DIRECTORY
from serving_study.engine.shm_loader import (
    MM_UTILS_RELATIVE_PATH,
    VariantSourceError,
    load_shm_pointer_class,
    load_variant_transport,
)
from serving_study.engine.variant_sources import (
    download_sglang_wheel,
    extract_transport_sources,
)

LOCAL_WHEEL = Path("/tmp/sgl/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl")
ORIGINAL_COPY = """\
            dst = torch.frombuffer(shm.buf, dtype=torch.uint8)
            dst.copy_(tensor.view(torch.uint8).reshape(-1))
"""
PR_48881_COPY = """\
            shm.buf[:] = tensor.detach().view(torch.uint8).reshape(-1).numpy()
"""


@pytest.fixture(scope="session")
def sglang_0_5_23(tmp_path_factory, pytestconfig) -> Path:
    if LOCAL_WHEEL.exists():
        wheel = LOCAL_WHEEL
    else:
        wheel = download_sglang_wheel("0.5.23", pytestconfig.cache.mkdir("sglang"))
    return extract_transport_sources(wheel, tmp_path_factory.mktemp("sglang-0.5.23"))


@pytest.fixture(scope="session")
def sglang_0_5_23_patched(sglang_0_5_23, tmp_path_factory) -> Path:
    patched = tmp_path_factory.mktemp("sglang-0.5.23-pr48881")
    shutil.copytree(sglang_0_5_23, patched, dirs_exist_ok=True)
    mm_utils = patched / MM_UTILS_RELATIVE_PATH
    text = mm_utils.read_text()
    assert text.count(ORIGINAL_COPY) == 1
    mm_utils.write_text(text.replace(ORIGINAL_COPY, PR_48881_COPY))
    return patched


def _open_in_child(sglang_root: Path, pickled: bytes, results) -> None:
    """Runs in a spawned process: unpickle (opens the segment), materialize."""
    load_shm_pointer_class(sglang_root)  # unpickling finds the class by module
    pointer = pickle.loads(pickled)
    tensor = pointer.materialize()
    results.put((tuple(tensor.shape), hashlib.sha256(tensor.numpy()).hexdigest()))


def _segment_exists(name: str) -> bool:
    return (SHM_DIRECTORY / name).exists()


def test_patched_class_is_the_patched_code(sglang_0_5_23, sglang_0_5_23_patched):
    original = load_shm_pointer_class(sglang_0_5_23)
    patched = load_shm_pointer_class(sglang_0_5_23_patched)

    original_init = inspect.getsource(original.__init__)
    patched_init = inspect.getsource(patched.__init__)
    assert original_init != patched_init
    assert "dst.copy_(" in original_init and ".numpy()" not in original_init
    assert "shm.buf[:] = tensor.detach()" in patched_init
    assert "dst.copy_(" not in patched_init


def test_loaded_file_and_hash_are_reported(sglang_0_5_23):
    variant = load_variant_transport(sglang_0_5_23)
    mm_utils = (sglang_0_5_23 / MM_UTILS_RELATIVE_PATH).resolve()
    assert variant.mm_utils_path == mm_utils
    assert variant.mm_utils_sha256 == hashlib.sha256(mm_utils.read_bytes()).hexdigest()
    assert variant.materializes
    assert "make_shm_name" in variant.free_names and "torch" in variant.free_names


@pytest.mark.parametrize("variant", ["sglang_0_5_23", "sglang_0_5_23_patched"])
def test_tensor_round_trips_through_dev_shm(variant, request):
    sglang_root = request.getfixturevalue(variant)
    shm_pointer_class = load_shm_pointer_class(sglang_root)
    pixels = np.random.default_rng(7).random((1024, 1536), dtype=np.float32)
    tensor = torch.from_numpy(pixels)

    pointer = shm_pointer_class(tensor)
    segment_name = pointer.__getstate__()["shm_name"]
    assert segment_name.startswith(f"sgl_shm_mm_{os.getpid()}_")
    assert _segment_exists(segment_name)

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(
        target=_open_in_child, args=(sglang_root, pickle.dumps(pointer), results)
    )
    child.start()
    try:
        shape, digest = results.get(timeout=60)
    finally:
        child.join(30)
    assert child.exitcode == 0
    assert shape == (1024, 1536)
    assert digest == hashlib.sha256(tensor.numpy()).hexdigest()
    assert not _segment_exists(segment_name)


def test_unknown_name_is_refused_with_file_and_names(sglang_0_5_23, tmp_path):
    shutil.copytree(sglang_0_5_23, tmp_path, dirs_exist_ok=True)
    mm_utils = tmp_path / MM_UTILS_RELATIVE_PATH
    text = mm_utils.read_text().replace(
        ORIGINAL_COPY, ORIGINAL_COPY + "            zlib.crc32(shm.buf)\n"
    )
    mm_utils.write_text(text)

    with pytest.raises(VariantSourceError) as raised:
        load_shm_pointer_class(tmp_path)
    assert str(mm_utils.resolve()) in str(raised.value)
    assert "zlib" in str(raised.value)


def test_source_without_the_class_is_refused(tmp_path):
    mm_utils = tmp_path / MM_UTILS_RELATIVE_PATH
    mm_utils.parent.mkdir(parents=True)
    mm_utils.write_text("import torch\n")
    with pytest.raises(VariantSourceError, match="has no top-level ShmPointerMMData"):
        load_shm_pointer_class(tmp_path)


def test_missing_source_names_the_expected_layout(tmp_path):
    with pytest.raises(VariantSourceError, match="sglang/srt/managers/mm_utils.py"):
        load_shm_pointer_class(tmp_path)
