"""Where a real SGLang server runs, and everything that follows from it, in one place.

The same ``sglang.launch_server`` arms run on a GPU host with the real model, or on
any Linux host's CPU with a seeded tiny model. What differs between the two is
decided here and nowhere else:

- server flags: none added on a GPU; on CPU ``--device cpu``, torch-native
  attention, SDPA vision attention, no CUDA graphs and ``--sleep-on-idle``;
- environment: on CPU ``SGLANG_USE_CPU_ENGINE=1`` (else SGLang does not treat
  the host as a CPU host);
- python path: the variant's tree and the load probe, plus on CPU the sgl-kernel
  stand-in (``envs/sglang-cpu/stand-in``; PyPI has no CPU build of sgl-kernel);
- local interpreter: on a GPU this host's Python with SGLang's dependencies; on
  CPU the runtime the workflow builds from ``envs/sglang-cpu/requirements.lock``;
- image: on a GPU the official SGLang image with the variant copied in
  (``envs/Dockerfile.sglang``); on CPU Debian with the same lock and the variant
  (``envs/Dockerfile.sglang-cpu``);
- container GPUs: ``--gpus`` on a GPU host, none on CPU.

Every SGLang server, on either platform, keeps torch inductor's compile cache in one
directory under ``resources/compile-cache/`` that all arms share (mounted into
containers), so that only the first server of a host or image pays the compile of
the kernels SGLang generates (on CPU, the rotary embedding's: ~15 s on 2 cores).

Without ``--sleep-on-idle`` SGLang's scheduler busy-polls a whole core between
requests, which on a CPU host would be counted against the quota under study.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DEVICES = ("cpu", "cuda")

CPU_SERVER_FLAGS = tuple(
    "--device cpu --attention-backend torch_native --mm-attention-backend sdpa "
    "--disable-cuda-graph --sleep-on-idle".split()
)
# The load probe pauses Python's garbage collector in each server process until
# SGLang's own post-warm-up gc freeze (envs/server-probe/serving_study_startup_gc.py):
# a fifth of a fresh server's start on a 2-core host; the runner checks it resumed.
STARTUP_GC_PAUSE_VARIABLE = "SERVING_STUDY_PAUSE_GC_AT_START"
CPU_ENVIRONMENT = {"SGLANG_USE_CPU_ENGINE": "1", STARTUP_GC_PAUSE_VARIABLE: "1"}

# What a run on a CPU host does not share with a GPU host, for the report.
CPU_HOST_DIFFERENCES = (
    "The model is a seeded tiny Qwen3-VL with random weights, not the real one; "
    "its image shapes are the real model's (a 256x256 image gives 64 image tokens, "
    "a 512x512 one 256).",
    "The scheduler's forward pass runs on the CPU. With the whole server under the "
    "quota (quota_scope server) it takes most of the quota, which a GPU host's "
    "scheduler does not; arms with quota_scope main_process keep it out of the "
    "quota instead.",
    "The main process preprocesses images on the CPU (a GPU host does it on the "
    "GPU, then copies the pixels to host memory before the shared-memory copy), "
    "with SGLang's CPU-host defaults (e.g. two image-processor threads, not one).",
    "SGLang runs with --device cpu, torch-native attention, SDPA vision attention, "
    "no CUDA graphs, --sleep-on-idle and SGLANG_USE_CPU_ENGINE=1, and a pure-torch "
    "stand-in for sgl-kernel's CPU build, whose placeholders never ran (checked).",
    "There is no cuda_ipc transport and no GPU utilisation to report.",
    "Each server process starts with Python's garbage collector paused, to start "
    "faster on few cores; SGLang's own gc freeze after its warm-up request turns "
    "it back on before the server is healthy (checked in every process).",
)

# Relative to the project root; each holds packages put on the server's PYTHONPATH.
LOAD_PROBE_DIRECTORY = "envs/server-probe"
KERNEL_STAND_IN_DIRECTORY = "envs/sglang-cpu/stand-in"
CPU_RUNTIME_LOCK = "envs/sglang-cpu/requirements.lock"
COMPILE_CACHE_ROOT = "resources/compile-cache"
COMPILE_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
CONTAINER_COMPILE_CACHE = "/var/cache/serving-study/torchinductor"


@dataclass(frozen=True)
class SGLangPlatform:
    """What a real SGLang server needs on one kind of host."""

    device: str
    server_flags: tuple[str, ...]
    environment: dict[str, str]
    python_path_directories: tuple[str, ...]  # project-relative, after the variant's
    dockerfile: str  # project-relative
    container_gpus: bool
    builds_runtime: bool  # the local runtime is the workflow's venv, not this host's


CPU_PLATFORM = SGLangPlatform(
    device="cpu",
    server_flags=CPU_SERVER_FLAGS,
    environment=dict(CPU_ENVIRONMENT),
    python_path_directories=(LOAD_PROBE_DIRECTORY, KERNEL_STAND_IN_DIRECTORY),
    dockerfile="envs/Dockerfile.sglang-cpu",
    container_gpus=False,
    builds_runtime=True,
)
GPU_PLATFORM = SGLangPlatform(
    device="cuda",
    server_flags=(),
    environment={},
    python_path_directories=(LOAD_PROBE_DIRECTORY,),
    dockerfile="envs/Dockerfile.sglang",
    container_gpus=True,
    builds_runtime=False,
)


def host_has_nvidia_gpu() -> bool:
    """An NVIDIA GPU this host can use: a driver device node and a GPU it lists."""
    if not Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is None:
        return False
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def resolve_device(setting: str) -> str:
    """``sglang.device``: cpu, cuda, or auto (cuda when this host has a GPU)."""
    if setting == "auto":
        return "cuda" if host_has_nvidia_gpu() else "cpu"
    if setting not in DEVICES:
        raise ValueError(f"sglang.device: {setting!r} is not one of auto, cpu, cuda")
    return setting


def platform_for(device: str) -> SGLangPlatform:
    """The platform of a resolved device (see ``resolve_device``)."""
    return CPU_PLATFORM if device == "cpu" else GPU_PLATFORM


PROJECT_ROOT = Path(__file__).resolve().parents[3]


def python_path(platform: SGLangPlatform, variant_python_root: str) -> str:
    """The server's PYTHONPATH on this host: the variant's tree first (so its
    ``sglang`` is the one imported), then the platform's directories."""
    directories = [
        str(PROJECT_ROOT / name) for name in platform.python_path_directories
    ]
    return os.pathsep.join([variant_python_root, *directories])


def compile_cache(platform: SGLangPlatform, in_container: bool) -> tuple[Path, str]:
    """torch inductor's cache for every server of one kind: the host directory
    (the runner creates it) and the path the server is told, which is that
    directory on this host and its mount point inside a container. Host and images
    keep separate caches: a kernel is built against the Python and compiler
    beside it."""
    where = "container" if in_container else "local"
    directory = PROJECT_ROOT / COMPILE_CACHE_ROOT / f"{where}-{platform.device}"
    return directory, CONTAINER_COMPILE_CACHE if in_container else str(directory)
