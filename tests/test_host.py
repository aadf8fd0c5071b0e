"""The preflight's host description and the needs it refuses to run without."""

import dataclasses

from study_helpers import arm_record

from serving_study.config.records import Arm, Workload
from serving_study.servers.host import (
    arm_thread_plan,
    feature_bytes,
    shared_memory_needed_mib,
    unmet_needs,
)


def workload(**fields) -> Workload:
    return Workload.from_config({"images": 1, **fields})


def arm(**fields) -> Arm:
    """An arm of the given fields; the ones these tests do not look at filled in."""
    return arm_record(**{"workload": "w512", **fields})


WORKLOADS = [
    workload(name="w512", width=512, height=512),
    workload(name="w2048", width=2048, height=2048),
]
ARMS = [
    arm(name="small", workload="w512", concurrency=16, cpu_quota=0.5),
    arm(name="big", workload="w2048", concurrency=4, cpu_quota="none"),
]
LOCAL = {"engine": "embedded", "runtime": "local"}


def host(**overrides) -> dict:
    base = {
        "shared_memory_free_mib": 10_000,
        "gpu": {"gpus": [], "reason": "no NVIDIA driver"},
        "container_runtimes": {
            "docker": {"installed": True, "engine_reachable": False},
            "podman": {"installed": False, "engine_reachable": False},
        },
    }
    return base | overrides


def test_feature_sizes_are_qwen3_vl_pixel_values():
    assert feature_bytes(512, 512) == 6 * 1024**2
    assert feature_bytes(2048, 2048) == 96 * 1024**2


def test_shared_memory_need_is_the_busiest_arm():
    assert shared_memory_needed_mib(ARMS, WORKLOADS) == 4 * 96


def test_too_little_shared_memory_is_refused_naming_the_sizes():
    needs = unmet_needs(host(shared_memory_free_mib=100), LOCAL, ARMS, WORKLOADS)
    assert len(needs) == 1
    assert "/dev/shm has 100 MiB free" in needs[0] and "384 MiB" in needs[0]


def test_enough_shared_memory_passes():
    no_quota = dataclasses.replace(ARMS[1], cpu_quota=None)
    assert unmet_needs(host(), LOCAL, [no_quota], WORKLOADS) == []


def test_sglang_engine_on_cuda_without_gpu_is_refused_and_on_cpu_is_not():
    on_cuda = {"engine": "sglang", "runtime": "local", "sglang_device": "cuda"}
    needs = unmet_needs(host(), on_cuda, [], None)
    assert any("runs the real model on an NVIDIA GPU" in need for need in needs)
    assert any("sglang.device: cpu" in need for need in needs)
    on_cpu = on_cuda | {"sglang_device": "cpu"}
    assert not any("GPU" in need for need in unmet_needs(host(), on_cpu, [], None))


def test_sglang_on_cpu_without_a_c_compiler_is_refused(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    on_cpu = {"engine": "sglang", "runtime": "local", "sglang_device": "cpu"}
    needs = unmet_needs(host(), on_cpu, [], None)
    assert any("needs a C compiler" in need and "gcc" in need for need in needs)


def test_container_runtime_without_engine_is_refused():
    needs = unmet_needs(host(), {"engine": "embedded", "runtime": "docker"}, [], None)
    assert any("'docker info' fails" in need for need in needs)
    needs = unmet_needs(host(), {"engine": "embedded", "runtime": "podman"}, [], None)
    assert any("'podman' is not installed" in need for need in needs)


def test_threads_far_above_the_quota_are_warned_about():
    plan = arm_thread_plan(
        [
            arm(name="default", cpu_quota=0.5, environment={}),
            arm(name="capped", cpu_quota=0.5, environment={"OMP_NUM_THREADS": "1"}),
            # One thread has no idle worker to spin, however small the quota.
            arm(name="one", cpu_quota=0.15, environment={"OMP_NUM_THREADS": "1"}),
        ]
    )
    default, capped, one = plan
    assert capped["intra_op_threads"] == 1 and capped["warning"] is None
    assert one["intra_op_threads"] == 1 and one["warning"] is None
    if default["intra_op_threads"] > 1:  # a host with one CPU starts one thread
        assert "ignores the quota" in default["warning"]
