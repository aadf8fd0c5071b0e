"""Where a real SGLang server runs, and everything that follows from it, in one place.

The same ``sglang.launch_server`` arms run on a GPU host with SGLang's own pinned
stack, on a GPU host whose torch is not SGLang's, or on any Linux host's CPU. What
differs between the three platforms is decided here and nowhere else:

- server flags: none added on a GPU with SGLang's stack; with the host's torch
  Triton attention, torch sampling, SDPA vision attention and no CUDA graphs (the
  paths that need no sgl-kernel); on CPU ``--device cpu``, torch-native attention,
  SDPA vision attention, no CUDA graphs and ``--sleep-on-idle``;
- environment: with the host's torch ``SGLANG_FORCE_FUSED_OP_BACKEND=torch`` (every
  fused op takes its torch code) and ``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1``;
  on CPU ``SGLANG_USE_CPU_ENGINE=1`` (else SGLang does not treat the host as a
  CPU host);
- python path: the variant's tree and the load probe, plus the stand-ins: on CPU
  for sgl-kernel's CPU build (``envs/sglang-cpu/stand-in``; PyPI has none), with
  the host's torch for sgl-kernel and cutlass (``envs/sglang-gpu-host/stand-in``:
  PyPI's sgl-kernel needs torch 2.14.1), then the runtime's own packages;
- local interpreter and runtime: on a GPU with SGLang's stack this host's Python
  as it is; with the host's torch this host's Python with the packages of
  ``envs/sglang-gpu-host/requirements.lock`` beside it (rule
  ``sglang_host_torch_runtime``); on CPU the venv the workflow builds from
  ``envs/sglang-cpu/requirements.lock`` (rule ``sglang_runtime``);
- image: on a GPU the official SGLang image with the variant copied in
  (``envs/Dockerfile.sglang``); on CPU Debian with the same lock and the variant
  (``envs/Dockerfile.sglang-cpu``); with the host's torch none (runtime local);
- container GPUs: ``--gpus`` on a GPU host, none on CPU;
- what the report says differs from the study's setup (``differences``).

Every SGLang server, on any platform, keeps torch inductor's compile cache in one
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
# Whose torch the server runs with (sglang.torch): SGLang's pinned stack, or this
# host's own with stand-ins for what is built against SGLang's (GPU hosts only).
TORCH_CHOICES = ("pinned", "host")

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

HOST_TORCH_SERVER_FLAGS = tuple(
    "--attention-backend triton --sampling-backend pytorch --mm-attention-backend "
    "sdpa --disable-prefill-cuda-graph --disable-decode-cuda-graph".split()
)
HOST_TORCH_ENVIRONMENT = {
    "SGLANG_FORCE_FUSED_OP_BACKEND": "torch",
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
}
# What a run with this host's torch does not share with the study, for the report
# (the model's own difference comes from the model's record).
HOST_TORCH_DIFFERENCES = (
    "SGLang runs with this host's torch (the runtime record names its version), not "
    "torch 2.14.1, SGLang 0.5.23's pin; the CPU-side packages it lacked come from "
    "envs/sglang-gpu-host/requirements.lock at SGLang's pins.",
    "sgl-kernel is a stand-in (PyPI's build loads only under torch 2.14.1), and so "
    "is cutlass (the CuTe DSL, not installed): every name of both is a placeholder "
    "that raises, and none ran (checked in every run's log). SGLang's model "
    "registry skips its muse_spark models, which fail to import on a placeholder.",
    "Without sgl-kernel the server takes SGLang's own fallbacks: Triton attention, "
    "torch sampling, SDPA vision attention, the torch code of every fused op "
    "(SGLANG_FORCE_FUSED_OP_BACKEND=torch) and no CUDA graphs, so its scheduler "
    "does more work per batch than the study's.",
)

# Relative to the project root; each holds packages put on the server's PYTHONPATH.
LOAD_PROBE_DIRECTORY = "envs/server-probe"
KERNEL_STAND_IN_DIRECTORY = "envs/sglang-cpu/stand-in"
GPU_STAND_IN_DIRECTORY = "envs/sglang-gpu-host/stand-in"
CPU_RUNTIME_LOCK = "envs/sglang-cpu/requirements.lock"
CPU_RUNTIME_RECORD = "resources/sglang-runtime/runtime.json"
HOST_TORCH_RUNTIME_LOCK = "envs/sglang-gpu-host/requirements.lock"
HOST_TORCH_RUNTIME_RECORD = "resources/sglang-host-torch-runtime/runtime.json"
COMPILE_CACHE_ROOT = "resources/compile-cache"
COMPILE_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
CONTAINER_COMPILE_CACHE = "/var/cache/serving-study/torchinductor"


@dataclass(frozen=True)
class SGLangPlatform:
    """What a real SGLang server needs on one kind of host.

    ``runtime_lock`` and ``runtime_record`` name the runtime the workflow builds
    for a local server (rules/runtime.smk) and the record its rule writes; None
    where the workflow's own Python serves. ``dockerfile`` is None where servers
    never run in a container.
    """

    device: str
    torch: str
    server_flags: tuple[str, ...]
    environment: dict[str, str]
    python_path_directories: tuple[str, ...]  # project-relative, after the variant's
    dockerfile: str | None  # project-relative
    container_gpus: bool
    runtime_lock: str | None
    runtime_record: str | None
    differences: tuple[str, ...]
    differences_heading: str = ""

    @property
    def builds_runtime(self) -> bool:
        """The local runtime is one the workflow builds, not this host's Python."""
        return self.runtime_record is not None


CPU_PLATFORM = SGLangPlatform(
    device="cpu",
    torch="pinned",
    server_flags=CPU_SERVER_FLAGS,
    environment=dict(CPU_ENVIRONMENT),
    python_path_directories=(LOAD_PROBE_DIRECTORY, KERNEL_STAND_IN_DIRECTORY),
    dockerfile="envs/Dockerfile.sglang-cpu",
    container_gpus=False,
    runtime_lock=CPU_RUNTIME_LOCK,
    runtime_record=CPU_RUNTIME_RECORD,
    differences=CPU_HOST_DIFFERENCES,
    differences_heading="SGLang's real server on CPU: what differs from a GPU host",
)
GPU_PLATFORM = SGLangPlatform(
    device="cuda",
    torch="pinned",
    server_flags=(),
    environment={},
    python_path_directories=(LOAD_PROBE_DIRECTORY,),
    dockerfile="envs/Dockerfile.sglang",
    container_gpus=True,
    runtime_lock=None,
    runtime_record=None,
    differences=(),
)
HOST_TORCH_PLATFORM = SGLangPlatform(
    device="cuda",
    torch="host",
    server_flags=HOST_TORCH_SERVER_FLAGS,
    environment=dict(HOST_TORCH_ENVIRONMENT),
    python_path_directories=(LOAD_PROBE_DIRECTORY, GPU_STAND_IN_DIRECTORY),
    dockerfile=None,
    container_gpus=True,
    runtime_lock=HOST_TORCH_RUNTIME_LOCK,
    runtime_record=HOST_TORCH_RUNTIME_RECORD,
    differences=HOST_TORCH_DIFFERENCES,
    differences_heading=(
        "SGLang's real server with this host's torch: what differs from the study"
    ),
)
PLATFORMS = (CPU_PLATFORM, GPU_PLATFORM, HOST_TORCH_PLATFORM)


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


def platform_for(device: str, torch: str = "pinned") -> SGLangPlatform:
    """The platform of a resolved device (see ``resolve_device``) and
    ``sglang.torch``; the host's torch is a GPU host's choice only."""
    for platform in PLATFORMS:
        if (platform.device, platform.torch) == (device, torch):
            return platform
    raise ValueError(
        f"sglang.torch {torch!r} on device {device!r}: the host's torch is for "
        "device cuda only (on CPU the workflow builds SGLang's pinned stack)"
    )


PROJECT_ROOT = Path(__file__).resolve().parents[3]


def python_path(
    platform: SGLangPlatform, variant_python_root: str, runtime_site: str | None = None
) -> str:
    """The server's PYTHONPATH on this host: the variant's tree first (so its
    ``sglang`` is the one imported), then the platform's directories, then the
    packages a runtime installs beside this host's Python (``runtime_site``)."""
    directories = [
        str(PROJECT_ROOT / name) for name in platform.python_path_directories
    ]
    site = [runtime_site] if runtime_site else []
    return os.pathsep.join([variant_python_root, *directories, *site])


def compile_cache(platform: SGLangPlatform, in_container: bool) -> tuple[Path, str]:
    """torch inductor's cache for every server of one kind: the host directory
    (the runner creates it) and the path the server is told, which is that
    directory on this host and its mount point inside a container. Host and images
    keep separate caches: a kernel is built against the Python and compiler
    beside it."""
    where = "container" if in_container else "local"
    directory = PROJECT_ROOT / COMPILE_CACHE_ROOT / f"{where}-{platform.device}"
    return directory, CONTAINER_COMPILE_CACHE if in_container else str(directory)
