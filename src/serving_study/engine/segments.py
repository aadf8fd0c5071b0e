"""Find and remove POSIX shared-memory segments by name."""

from __future__ import annotations

from multiprocessing import shared_memory
from pathlib import Path

SHM_DIRECTORY = Path("/dev/shm")
SGLANG_SEGMENT_PREFIX = "sgl_shm_"


def unlink_segment(name: str) -> bool:
    """Unlink the named segment; False if it was already gone.

    Goes through `SharedMemory` so that the resource tracker, which registered
    the segment when it was created, forgets it again.
    """
    try:
        segment = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return False
    try:
        segment.unlink()
    finally:
        segment.close()
    return True


def release_segments(payloads) -> None:
    """Unlink the segments of feature payloads that will never be consumed."""
    for payload in payloads:
        if payload.segment_name:
            unlink_segment(payload.segment_name)


def list_segments(prefix: str = SGLANG_SEGMENT_PREFIX) -> list[str]:
    """Names of the segments under /dev/shm that start with prefix."""
    return sorted(path.name for path in SHM_DIRECTORY.glob(f"{prefix}*"))
