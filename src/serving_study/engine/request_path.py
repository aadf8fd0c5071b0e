"""The main process's per-request work: image bytes to transport payloads.

This runs on the asyncio event-loop thread, as SGLang's TokenizerManager runs
it with one tokenizer worker: base64-decode and image decode, preprocessing,
then the variant's `ShmPointerMMData(tensor)`, whose copy into the fresh
segment is the one place the main process enters PyTorch's intra-op pool.
With the cuda_ipc transport the tensor stays on (or goes to) the GPU instead
and only an IPC handle is pickled.

Preprocessing (`preprocess`) runs on the CPU or the GPU; the cpu transport then
copies the pixels back to host memory (the `device_to_host` stage).

Each stage's wall time, calling-thread CPU time and whole-process CPU time
are summed, so `/server_info` can show where the main process spends CPU.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from serving_study.engine.preprocess import (
    decode_image,
    llm_image_tokens,
    preprocess_image,
    preprocess_image_on_device,
)
from serving_study.engine.protocol import (
    CUDA_IPC,
    CUDA_IPC_TRANSPORT,
    INLINE,
    SHM,
    TRANSPORTS,
    FeaturePayload,
)
from serving_study.engine.segments import release_segments

STAGES = ("decode", "preprocess", "device_to_host", "transport")
PREPROCESS_DEVICES = ("cpu", "cuda")

logger = logging.getLogger("serving_study.engine.request_path")


class InvalidImage(ValueError):
    """An image in the request cannot be decoded (HTTP 400)."""


@dataclass
class StageTotals:
    wall_s: float = 0.0
    thread_cpu_s: float = 0.0
    process_cpu_s: float = 0.0


@dataclass
class RequestPathTimings:
    """Sums over all images prepared so far, per stage."""

    images: int = 0
    stages: dict[str, StageTotals] = field(
        default_factory=lambda: {stage: StageTotals() for stage in STAGES}
    )


@contextlib.contextmanager
def _stage(totals: StageTotals) -> Iterator[None]:
    """Add the enclosed stage's elapsed times to its totals."""
    wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
    try:
        yield
    finally:
        totals.wall_s += time.perf_counter() - wall
        totals.thread_cpu_s += time.thread_time() - thread
        totals.process_cpu_s += time.process_time() - process


@dataclass
class PreparedImages:
    payloads: tuple[FeaturePayload, ...]
    image_tokens: list[int]
    # CUDA tensors whose IPC handles are in flight: the producer keeps them.
    gpu_tensors: list = field(default_factory=list)


class RequestPath:
    """Prepares each request's images for the scheduler, with the variant's class."""

    def __init__(
        self, shm_pointer_class: type, transport: str, preprocess_device: str = "cpu"
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport {transport!r} is not one of {TRANSPORTS}")
        if preprocess_device not in PREPROCESS_DEVICES:
            raise ValueError(
                f"preprocess device {preprocess_device!r} is not one of "
                f"{PREPROCESS_DEVICES}"
            )
        self._shm_pointer_class = shm_pointer_class
        self._transport = transport
        self._preprocess_device = preprocess_device
        self.timings = RequestPathTimings()
        # Images sent inline because /dev/shm was full: the copy under study skipped.
        self.inline_fallbacks = 0
        if transport == CUDA_IPC_TRANSPORT:
            # Registers the CUDA tensor reductions (IPC handles) with pickling.
            from multiprocessing.reduction import ForkingPickler

            import torch.multiprocessing  # noqa: F401

            self._pickle_cuda = ForkingPickler.dumps

    def prepare(self, images_base64: tuple[str, ...]) -> PreparedImages:
        """Decode, preprocess and wrap each image. Raises InvalidImage."""
        prepared = PreparedImages(payloads=(), image_tokens=[])
        try:
            for image_base64 in images_base64:
                self._prepare_one(image_base64, prepared)
        except BaseException:
            release_segments(prepared.payloads)
            raise
        return prepared

    def _prepare_one(self, image_base64: str, prepared: PreparedImages) -> None:
        stages = self.timings.stages
        with _stage(stages["decode"]):
            try:
                data = base64.b64decode(image_base64, validate=True)
            except ValueError as error:  # binascii.Error among them
                raise InvalidImage(f"the image is not valid base64: {error}") from error
            try:
                image = decode_image(data)
            except ValueError as error:
                raise InvalidImage(str(error)) from error
        with _stage(stages["preprocess"]):
            if self._preprocess_device == "cpu":
                features = preprocess_image(image)
                pixel_values = torch.from_numpy(features.pixel_values)
                grid = features.image_grid_thw
            else:
                pixel_values, grid = preprocess_image_on_device(
                    image, self._preprocess_device
                )
                # Wait for the kernels here, so that their time is this stage's
                # and not the next one's (a `.cpu()` would wait for them anyway).
                torch.cuda.synchronize()
        if self._transport == CUDA_IPC_TRANSPORT:
            with _stage(stages["transport"]):
                on_gpu = pixel_values.to("cuda")
                prepared.gpu_tensors.append(on_gpu)
                payload = FeaturePayload(
                    kind=CUDA_IPC, pickled=bytes(self._pickle_cuda(on_gpu))
                )
        else:
            with _stage(stages["device_to_host"]):
                pixel_values = pixel_values.cpu()
            with _stage(stages["transport"]):
                payload = self._wrap_shm(pixel_values)
        self.timings.images += 1
        prepared.payloads += (payload,)
        prepared.image_tokens.append(llm_image_tokens(grid))

    def _wrap_shm(self, pixel_values: torch.Tensor) -> FeaturePayload:
        try:
            pointer = self._shm_pointer_class(pixel_values)
        except OSError as error:
            # SGLang's _wrap_shm_or_inline: a full /dev/shm falls back to inline.
            self.inline_fallbacks += 1
            if self.inline_fallbacks == 1:
                logger.warning(
                    "shared memory allocation failed (%s); falling back to "
                    "inline transport. Consider increasing /dev/shm size.",
                    error,
                )
            return FeaturePayload(kind=INLINE, pickled=pickle.dumps(pixel_values))
        segment_name = pointer.__getstate__()["shm_name"]
        return FeaturePayload(
            kind=SHM, pickled=pickle.dumps(pointer), segment_name=segment_name
        )
