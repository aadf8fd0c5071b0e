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
from conftest import ORIGINAL_COPY

from serving_study.engine.segments import SHM_DIRECTORY, unlink_segment
from serving_study.engine.shm_loader import (
    MM_UTILS_RELATIVE_PATH,
    VariantSourceError,
    load_shm_pointer_class,
    load_variant_transport,
)


def _open_in_child(pickled_by_root: dict[Path, bytes], results) -> None:
    """Runs in a spawned process: unpickle (opens the segment), materialize."""
    for sglang_root, pickled in pickled_by_root.items():
        load_shm_pointer_class(sglang_root)  # unpickling finds the class by module
        tensor = pickle.loads(pickled).materialize()
        digest = hashlib.sha256(tensor.numpy()).hexdigest()
        results.put((sglang_root, tuple(tensor.shape), digest))


def _segment_exists(name: str) -> bool:
    return (SHM_DIRECTORY / name).exists()


def test_patched_class_is_the_patched_code(
    transport_sources_0_5_23, transport_sources_0_5_23_patched
):
    original = load_shm_pointer_class(transport_sources_0_5_23)
    patched = load_shm_pointer_class(transport_sources_0_5_23_patched)

    original_init = inspect.getsource(original.__init__)
    patched_init = inspect.getsource(patched.__init__)
    assert original_init != patched_init
    assert "dst.copy_(" in original_init and ".numpy()" not in original_init
    assert "shm.buf[:] = tensor.detach()" in patched_init
    assert "dst.copy_(" not in patched_init


def test_loaded_file_and_hash_are_reported(transport_sources_0_5_23):
    variant = load_variant_transport(transport_sources_0_5_23)
    mm_utils = (transport_sources_0_5_23 / MM_UTILS_RELATIVE_PATH).resolve()
    assert variant.mm_utils_path == mm_utils
    assert variant.mm_utils_sha256 == hashlib.sha256(mm_utils.read_bytes()).hexdigest()
    assert variant.materializes
    assert "make_shm_name" in variant.free_names and "torch" in variant.free_names


def test_both_classes_round_trip_a_tensor_through_dev_shm(
    transport_sources_0_5_23, transport_sources_0_5_23_patched
):
    pixels = np.random.default_rng(7).random((1024, 1536), dtype=np.float32)
    tensor = torch.from_numpy(pixels)
    expected_digest = hashlib.sha256(pixels).hexdigest()
    roots = (transport_sources_0_5_23, transport_sources_0_5_23_patched)
    pointers = {root: load_shm_pointer_class(root)(tensor) for root in roots}
    segment_names = [p.__getstate__()["shm_name"] for p in pointers.values()]
    for name in segment_names:
        assert name.startswith(f"sgl_shm_mm_{os.getpid()}_")
        assert _segment_exists(name)

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    pickled = {root: pickle.dumps(pointer) for root, pointer in pointers.items()}
    child = context.Process(target=_open_in_child, args=(pickled, results))
    child.start()
    try:
        received = [results.get(timeout=60) for _ in roots]
        child.join(30)
        left_over = [name for name in segment_names if _segment_exists(name)]
    finally:
        child.join(30)
        for name in segment_names:
            unlink_segment(name)  # only if the test failed before the child did

    assert child.exitcode == 0
    assert [root for root, _, _ in received] == list(roots)
    for _, shape, digest in received:
        assert shape == (1024, 1536)
        assert digest == expected_digest
    assert left_over == []


def test_unknown_name_is_refused_with_file_and_names(
    transport_sources_0_5_23, tmp_path
):
    shutil.copytree(transport_sources_0_5_23, tmp_path, dirs_exist_ok=True)
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
