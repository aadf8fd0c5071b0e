"""Messages between the engine's main process and its scheduler process.

They travel pickled over one duplex pipe, as SGLang's tokenizer manager and
scheduler talk over ZMQ with pickled objects. A request's image features are
pickled separately (`FeaturePayload.pickled`), so that the scheduler decides
when to unpickle them: for the SHM transport, unpickling is what opens the
shared-memory segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# The feature transports an arm can choose (SGLang's --mm-feature-transport).
CPU_TRANSPORT = "cpu"
CUDA_IPC_TRANSPORT = "cuda_ipc"
TRANSPORTS = (CPU_TRANSPORT, CUDA_IPC_TRANSPORT)

SHM = "shm"
INLINE = "inline"
CUDA_IPC = "cuda_ipc"


@dataclass(frozen=True)
class FeaturePayload:
    """One image's `pixel_values`, as the chosen transport carries it.

    `kind` is SHM (a pickled `ShmPointerMMData`), INLINE (a pickled CPU
    tensor, SGLang's fallback when /dev/shm is full) or CUDA_IPC (a pickled
    CUDA tensor, i.e. an IPC handle). `segment_name` names the SHM segment so
    that either side can unlink it without opening it.
    """

    kind: str
    pickled: bytes
    segment_name: str | None = None


@dataclass(frozen=True)
class SubmitRequest:
    request_id: int
    features: tuple[FeaturePayload, ...]
    output_tokens: int


@dataclass(frozen=True)
class AbortRequest:
    request_id: int


@dataclass(frozen=True)
class SchedulerReady:
    pid: int
    torch_num_threads: int
    receive_path: str


class TokenEvent(NamedTuple):
    request_id: int
    token_index: int
    finished: bool


@dataclass(frozen=True)
class TokenBatch:
    """All tokens one scheduler step produced."""

    events: tuple[TokenEvent, ...]


@dataclass(frozen=True)
class RequestFailed:
    request_id: int
    error: str
