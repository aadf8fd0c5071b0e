"""What differs between a GPU host and a CPU host is decided in one place."""

import os
from pathlib import Path

import pytest

from serving_study.config import platform as sglang_platform
from serving_study.config.platform import (
    CPU_PLATFORM,
    GPU_PLATFORM,
    platform_for,
    python_path,
    resolve_device,
)

ROOT = Path(__file__).resolve().parents[1]


def test_an_explicit_device_is_kept_and_auto_follows_the_host(monkeypatch):
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda") == "cuda"
    monkeypatch.setattr(sglang_platform, "host_has_nvidia_gpu", lambda: False)
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(sglang_platform, "host_has_nvidia_gpu", lambda: True)
    assert resolve_device("auto") == "cuda"
    with pytest.raises(ValueError, match="sglang.device"):
        resolve_device("tpu")


def test_this_host_without_a_gpu_resolves_to_cpu():
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this host has an NVIDIA driver")
    assert platform_for(resolve_device("auto")) is CPU_PLATFORM


def test_the_variants_tree_comes_first_then_the_probe_and_on_cpu_the_stand_in():
    on_cpu = python_path(CPU_PLATFORM, "/variants/patched/python").split(os.pathsep)
    on_gpu = python_path(GPU_PLATFORM, "/variants/patched/python").split(os.pathsep)
    assert on_cpu == [
        "/variants/patched/python",
        str(ROOT / "envs" / "server-probe"),
        str(ROOT / "envs" / "sglang-cpu" / "stand-in"),
    ]
    assert on_gpu == on_cpu[:2]
    for directory in on_cpu[1:]:
        assert Path(directory).is_dir()


def test_each_platform_names_files_that_exist():
    for platform in (CPU_PLATFORM, GPU_PLATFORM):
        assert (ROOT / platform.dockerfile).is_file()
    assert (ROOT / sglang_platform.CPU_RUNTIME_LOCK).is_file()
    assert CPU_PLATFORM.builds_runtime and not GPU_PLATFORM.builds_runtime
    assert not CPU_PLATFORM.container_gpus and GPU_PLATFORM.container_gpus
