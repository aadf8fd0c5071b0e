"""Each variant's copy into shared memory beside this host's single-thread memcpy,
in a fresh process with the server's default threads."""

import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from serving_study.servers.environment import server_environment
from serving_study.studies.harness.benchmark_host import host_load_between, read_cpu

BYTES_PER_GB = 1e9
MEMCPY_SEGMENT_PREFIX = "harness_memcpy_"  # + creator pid: segments of the memcpy runs


def measure_shm_copy(
    variants: dict[str, Path],
    rows: list[int],
    columns: int,
    repeats: int,
    niceness: int | None = None,
) -> dict:
    """Run `shm_copy_figures` in a fresh process with the server's default threads.

    The server strips every thread setting from its environment (Snakemake sets
    OMP_NUM_THREADS for its jobs), so torch there sizes its intra-op pool from the
    visible CPUs; the measuring process is started the same way.
    """
    command = [sys.executable, "-m", "serving_study.studies.harness", "shm-copy"]
    if niceness is not None:
        command += ["--niceness", str(niceness)]
    command += ["--columns", str(columns), "--repeats", str(repeats), "--rows"]
    command += [str(count) for count in rows]
    for name, root in variants.items():
        command += ["--variant", f"{name}={root}"]
    before = read_cpu()
    finished = subprocess.run(
        command,
        env=server_environment(os.environ, {}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if finished.returncode != 0:
        raise RuntimeError(f"the shm-copy benchmark failed:\n{finished.stderr[-3000:]}")
    return {**json.loads(finished.stdout), **host_load_between(before, read_cpu())}


def shm_copy_figures(
    variants: dict[str, Path], rows: list[int], columns: int, repeats: int
) -> dict:
    """GB/s of each variant's ShmPointerMMData and of memcpy, per tensor size.

    One float32 tensor of (rows, columns) per size, as the image processor makes
    them. Per repeat, in turn: each variant's constructor plus the segment's
    unlink (the whole life of a segment in the sender); one memcpy into fresh
    anonymous memory (mmap, copy, munmap: page faults and zeroing included); one
    memcpy into a new /dev/shm segment (create, fallocate, copy, unlink: what the
    patched constructor does without torch); one memcpy into memory already
    faulted in (the bandwidth of the copy alone). Each copy's best round (its
    speed when nothing else on the host got in the way) and its median are given.
    The time this process took to import torch is reported too: every server
    process pays it at start-up.
    """
    import_started = time.perf_counter()
    import torch

    torch_import_s = time.perf_counter() - import_started

    from serving_study.engine.segments import unlink_segment
    from serving_study.engine.shm_loader import load_shm_pointer_class

    classes = {name: load_shm_pointer_class(root) for name, root in variants.items()}
    results = {}
    for row_count in rows:
        tensor = torch.rand(row_count, columns, dtype=torch.float32)
        nbytes = tensor.numel() * tensor.element_size()
        source_address = tensor.data_ptr()
        prefaulted = mmap.mmap(-1, nbytes)
        prefaulted_address = _address_of(prefaulted)
        ctypes.memset(prefaulted_address, 1, nbytes)

        def variant_copy(shm_pointer_class=None, tensor=tensor):
            unlink_segment(shm_pointer_class(tensor).shm_name)

        def fresh_memcpy(nbytes=nbytes, source_address=source_address):
            fresh = mmap.mmap(-1, nbytes)
            ctypes.memmove(_address_of(fresh), source_address, nbytes)
            fresh.close()

        def segment_memcpy(nbytes=nbytes, source_address=source_address):
            _memcpy_into_new_segment(source_address, nbytes)

        def prefaulted_memcpy(
            nbytes=nbytes, source_address=source_address, target=prefaulted_address
        ):
            ctypes.memmove(target, source_address, nbytes)

        copies: dict[str, Callable[[], None]] = {
            f"variant:{name}": (lambda c=cls: variant_copy(c))
            for name, cls in classes.items()
        }
        copies |= {
            "memcpy_fresh": fresh_memcpy,
            "memcpy_new_segment": segment_memcpy,
            "memcpy_prefaulted": prefaulted_memcpy,
        }
        seconds: dict[str, list[float]] = {name: [] for name in copies}
        names = list(copies)
        for repeat in range(repeats + 1):  # the first round warms up
            # A different order each round, so that no copy always follows another.
            shift = repeat % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.perf_counter()
                copies[name]()
                if repeat:
                    seconds[name].append(time.perf_counter() - started)
        prefaulted.close()

        results[str(row_count)] = {
            "shape": [row_count, columns],
            "bytes": nbytes,
            "gbps_best": {
                name: _gbps(nbytes, min(times)) for name, times in seconds.items()
            },
            "gbps_median": {
                name: _gbps(nbytes, statistics.median(times))
                for name, times in seconds.items()
            },
        }
    return {
        "pid": os.getpid(),
        "torch_threads": torch.get_num_threads(),
        "torch_import_s": round(torch_import_s, 3),
        "thread_settings_in_environment": {
            name: value for name, value in os.environ.items() if "THREADS" in name
        },
        "repeats": repeats,
        "sizes": results,
    }


def _gbps(nbytes: int, seconds: float) -> float | None:
    return round(nbytes / seconds / BYTES_PER_GB, 3) if seconds > 0 else None


def _address_of(buffer: mmap.mmap) -> int:
    """The address of a mapping's first byte (the view is released at once)."""
    view = (ctypes.c_char * len(buffer)).from_buffer(buffer)
    try:
        return ctypes.addressof(view)
    finally:
        del view


def _memcpy_into_new_segment(source_address: int, nbytes: int) -> None:
    from multiprocessing import shared_memory

    name = f"{MEMCPY_SEGMENT_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
    segment = shared_memory.SharedMemory(create=True, size=nbytes, name=name)
    try:
        os.posix_fallocate(segment._fd, 0, nbytes)
        target = (ctypes.c_char * nbytes).from_buffer(segment.buf)
        ctypes.memmove(ctypes.addressof(target), source_address, nbytes)
        del target
    finally:
        segment.close()
        segment.unlink()


def summarize_shm_copy(figures: dict, image_sizes: dict[str, int]) -> dict:
    """`shm_copy_gbps` per variant and image size beside `memcpy_gbps`, and ratios.

    Best rounds are compared: on a shared host they are the closest to what the
    copy itself costs. The reference is memcpy into fresh memory: every
    ShmPointerMMData copies into a segment created for it, whose pages the kernel
    must allocate and zero first; memcpy into memory already faulted in is the
    bandwidth of the copy alone, which no new segment can reach.
    """
    shm_copy_gbps: dict[str, dict[str, float]] = {}
    memcpy_gbps: dict[str, dict[str, float]] = {}
    for image_size, row_count in image_sizes.items():
        size = figures["sizes"][str(row_count)]
        for name, gbps in size["gbps_best"].items():
            if name.startswith("variant:"):
                variant = name.removeprefix("variant:")
                shm_copy_gbps.setdefault(variant, {})[image_size] = gbps
            else:
                kind = name.removeprefix("memcpy_")
                memcpy_gbps.setdefault(kind, {})[image_size] = gbps
    ratios = {
        variant: {
            image_size: round(gbps / memcpy_gbps["fresh"][image_size], 3)
            for image_size, gbps in by_size.items()
        }
        for variant, by_size in shm_copy_gbps.items()
    }
    patched = ratios.get("patched", {})
    return {
        "shm_copy_gbps": shm_copy_gbps,
        "memcpy_gbps": memcpy_gbps,
        "shm_copy_to_memcpy_fresh_ratio": ratios,
        "shm_copy_patched_to_memcpy_ratio": min(patched.values()) if patched else None,
        "torch_threads": figures["torch_threads"],
        "torch_import_s": figures["torch_import_s"],
        "host_busy_cores": figures.get("host_busy_cores"),
        "rows_per_image_size": image_sizes,
        "raw": figures,
    }
