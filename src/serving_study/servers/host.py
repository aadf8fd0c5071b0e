"""Describing the host an experiment runs on, and refusing hosts that cannot run it.

The preflight rule writes this description to ``results/<experiment>/host.json``; the
report prints it in its header. What a server will really start with is measured,
not assumed: the intra-op thread count comes from a fresh Python process started
with each arm's environment, because PyTorch sizes its pool from the CPUs it can
see, never from the CPU quota (the trap the study fell into).
"""

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from serving_study.config.prescription import prescription
from serving_study.config.records import Arm, Workload
from serving_study.config.secrets import describe_missing, missing_secrets
from serving_study.engine.preprocess import feature_bytes
from serving_study.servers.environment import server_environment


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def memory_gib() -> float | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    return None


def cgroup_version() -> str:
    mounts = Path("/proc/self/mounts").read_text().split("\n")
    has_v1_cpu = any(
        fields[2] == "cgroup" and "cpu" in fields[3].split(",")
        for fields in (line.split() for line in mounts if line)
    )
    if has_v1_cpu:
        return "v1"
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "v2"
    return "none"


def shared_memory_free_mib() -> float | None:
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return None
    return round(stats.f_bavail * stats.f_frsize / 1024**2, 1)


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for package in "snakemake torch numpy pillow aiohttp psutil pandas altair".split():
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def intra_op_threads(environment: dict[str, str]) -> int | None:
    """The thread count torch starts with in a fresh process with this environment."""
    command = [sys.executable, "-c", "import torch; print(torch.get_num_threads())"]
    try:
        finished = subprocess.run(
            command,
            env=server_environment(os.environ, environment),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    return int(finished.stdout.strip())


def gpu_description() -> dict:
    """Model, driver and memory of each visible NVIDIA GPU, or why there is none."""
    try:
        import pynvml
    except ImportError:
        return {"gpus": [], "reason": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return {"gpus": [], "reason": f"no NVIDIA driver ({error})"}
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                {
                    "index": index,
                    "name": pynvml.nvmlDeviceGetName(handle),
                    "memory_gib": round(memory.total / 1024**3, 1),
                }
            )
        return {
            "gpus": gpus,
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "reason": None if gpus else "the driver reports no GPU",
        }
    finally:
        pynvml.nvmlShutdown()


def container_runtimes() -> dict:
    """Versions of docker and podman, and whether an engine answers."""
    runtimes = {}
    for name in ("docker", "podman"):
        path = shutil.which(name)
        if path is None:
            runtimes[name] = {"installed": False, "engine_reachable": False}
            continue
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        engine = subprocess.run(
            [path, "info", "--format", "{{json .}}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        runtimes[name] = {
            "installed": True,
            "version": version,
            "engine_reachable": engine.returncode == 0,
        }
    return runtimes


def arm_thread_plan(arms: list[Arm], fixes_tables: list[Path] = ()) -> list[dict]:
    """Per arm: the quota, the intra-op threads its server will start, and a warning
    when there are several and they exceed the quota by more than 2x (the study's
    trap: one thread has no idle worker to spin), with the doctor's prescription
    (prescription.py; ``fixes_tables`` are the published measurements of the
    fixes)."""

    def environment_key(arm: Arm) -> str:
        return json.dumps(dict(arm.environment), sort_keys=True)

    # One probe per distinct environment, side by side: each imports torch (~4 s).
    environments = {environment_key(arm): dict(arm.environment) for arm in arms}
    with ThreadPoolExecutor(max_workers=max(1, len(environments))) as probes:
        probed = probes.map(intra_op_threads, environments.values())
        threads_by_environment = dict(zip(environments, probed, strict=True))
    plan = []
    for arm in arms:
        threads = threads_by_environment[environment_key(arm)]
        quota = arm.cpu_quota
        warning = None
        if threads and threads > 1 and quota is not None and threads > 2 * quota:
            warning = (
                f"arm {arm.name}: the server starts {threads} intra-op threads "
                f"under a {quota:g}-core quota ({threads / quota:.1f}x): PyTorch's "
                "OpenMP pool ignores the quota, as in the study.\n"
                + prescription(threads, quota, list(fixes_tables))
            )
        plan.append(
            {
                "arm": arm.name,
                "quota_cores": quota,
                "environment": dict(arm.environment),
                "secret_environment": list(arm.secret_environment),
                "intra_op_threads": threads,
                "warning": warning,
            }
        )
    return plan


def describe_host(engine: dict) -> dict:
    """Everything the report's header and the run validity checks need (what each
    arm will start is its own preflight's: arm_thread_plan)."""
    affinity = os.sched_getaffinity(0)
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "visible_cpus": len(affinity),
        "memory_gib": memory_gib(),
        "cgroup_version": cgroup_version(),
        "shared_memory_free_mib": shared_memory_free_mib(),
        "gpu": gpu_description(),
        "container_runtimes": container_runtimes(),
        "engine": engine["engine"],
        "runtime": engine["runtime"],
        "versions": package_versions(),
    }


def quota_problem() -> str | None:
    """Why no CPU-quota cgroup can be made here, or None when one can."""
    from serving_study.servers.cgroups import CpuQuotaGroup, QuotaUnavailable
    from serving_study.servers.owners import owned_name

    try:
        probe = CpuQuotaGroup.create(owned_name("preflight"), 0.5)
    except QuotaUnavailable as error:
        return str(error)
    probe.remove()
    return None


def shared_memory_needed_mib(arms: list[Arm], workloads: list[Workload]) -> float:
    """/dev/shm the busiest arm can hold at once: one segment per request in flight."""
    sizes = {workload.name: (workload.height, workload.width) for workload in workloads}
    return max(
        arm.concurrency * feature_bytes(*sizes[arm.workload]) / 1024**2 for arm in arms
    )


# What torch inductor calls to build the CPU kernels it generates.
C_COMPILERS = ("gcc", "cc", "clang")


def unmet_needs(
    host: dict, engine: dict, arms: list[Arm], workloads: list[Workload] | None = None
) -> list[str]:
    """What the experiment needs that this host lacks, one sentence each."""
    needs = describe_missing(missing_secrets(arms, os.environ))
    local = engine["runtime"] == "local"
    free_mib = host.get("shared_memory_free_mib")
    if workloads and local and free_mib is not None:
        needed_mib = shared_memory_needed_mib(arms, workloads)
        if free_mib < needed_mib:
            needs.append(
                f"/dev/shm has {free_mib:.0f} MiB free, but the arms need up to "
                f"{needed_mib:.0f} MiB (one pixel_values segment per request in "
                "flight); a full /dev/shm makes the server send images inline and "
                "skip the copy under study: free or enlarge /dev/shm"
            )
    if local and any(arm.cpu_quota for arm in arms):
        problem = quota_problem()
        if problem:
            needs.append(f"arms with a cpu_quota need a CPU-quota cgroup: {problem}")
    device = engine.get("sglang_device") if engine["engine"] == "sglang" else None
    if device == "cuda" and not host["gpu"]["gpus"]:
        needs.append(
            "engine 'sglang' with sglang.device cuda runs the real model on an NVIDIA "
            f"GPU, but this host has none ({host['gpu']['reason']}); set "
            "sglang.device: cpu (a tiny model on the CPU, config/sglang-cpu.yaml) or "
            "use a GPU host"
        )
    if device == "cpu" and local and not any(map(shutil.which, C_COMPILERS)):
        needs.append(
            "SGLang on CPU compiles its rotary-embedding kernel with torch inductor "
            "on the first request, which needs a C compiler, and this host has none "
            f"(looked for {', '.join(C_COMPILERS)}); install one, e.g. `apt-get "
            "install gcc` on Debian"
        )
    if engine["runtime"] in ("docker", "podman"):
        runtime = host["container_runtimes"][engine["runtime"]]
        if not runtime["installed"]:
            needs.append(
                f"runtime '{engine['runtime']}' is not installed; install it or set "
                "runtime: local"
            )
        elif not runtime["engine_reachable"]:
            needs.append(
                f"runtime '{engine['runtime']}' is installed but its engine does not "
                f"answer ('{engine['runtime']} info' fails); start it or set "
                "runtime: local"
            )
        largest_quota = max((arm.cpu_quota or 0 for arm in arms), default=0)
        cpus = host.get("cpu_count")
        if cpus and largest_quota > cpus:
            needs.append(
                f"runtime '{engine['runtime']}' gives each arm its quota as --cpus, "
                f"which may not exceed this host's {cpus} CPUs, but an arm asks for "
                f"{largest_quota:g}; lower its cpu_quota or use a larger host"
            )
    return needs
