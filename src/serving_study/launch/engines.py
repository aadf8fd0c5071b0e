"""An arm's launch plan, from the engine the config names: chosen here, and only here.

Each engine's adapter decides its command (``embedded.py``, ``sglang.py``); what
every plan takes from the arm alike is added here: the quota with its scope and
timing, the host variables a local server keeps, the container's options, and what
the server must report back.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from serving_study.config.platform import PROJECT_ROOT
from serving_study.config.records import Arm, ServerSettings, Variant
from serving_study.engine.preprocess import feature_bytes
from serving_study.launch.embedded import embedded_command
from serving_study.launch.plan import (
    HOST_VARIABLES,
    ContainerOptions,
    EngineCommand,
    Expected,
    LaunchPlan,
    Quota,
)
from serving_study.launch.sglang import sglang_command
from serving_study.sources.images import read_image_id

ENGINES = {"embedded": embedded_command, "sglang": sglang_command}
MIB = 1 << 20
# Room in /dev/shm besides the image tensors (torch and SGLang keep a little there).
SHARED_MEMORY_HEADROOM = 256 * MIB
SHARED_MEMORY_MINIMUM = 1024 * MIB


def launch_plan(
    server: ServerSettings,
    arm: Arm,
    variant: Variant,
    workload_manifest: Path,
    port: int | None = None,
) -> LaunchPlan:
    """How the arm's server starts (``port`` None until a run picks one)."""
    command = ENGINES[server.engine](server, arm, variant)
    local = not server.in_container
    environment = dict(command.environment)
    if not local:
        # The image's root is read-only: caches go to the container's scratch /tmp.
        environment = {"HOME": "/tmp"} | environment
    return LaunchPlan(
        engine=server.engine,
        argv=command.argv,
        port=port,
        environment=environment,
        secret_environment=arm.secret_environment,
        host_environment=HOST_VARIABLES if local else (),
        working_directory=str(PROJECT_ROOT) if local else None,
        quota=Quota(arm.cpu_quota, arm.quota_scope, arm.quota_timing),
        stop_signal=command.stop_signal,
        stop_leader_only=command.stop_leader_only,
        served_model_name=command.served_model_name,
        expected=Expected(
            transport=arm.transport,
            mm_utils_sha256=variant.mm_utils_sha256,
            patched_modules=command.patched_modules,
            checked_environment=tuple(sorted(arm.environment)),
            reported_in=command.reported_in,
        ),
        container=None
        if local
        else container_options(server, arm, command, workload_manifest),
    )


def container_options(
    server: ServerSettings, arm: Arm, command: EngineCommand, workload_manifest: Path
) -> ContainerOptions:
    """The container of the config's ``container`` section: a private /dev/shm
    sized for the workload (Docker's default 64 MiB would silently push SGLang off
    the shared-memory path under study) unless it sets one or the host's IPC;
    ``gpus: auto`` gives an engine that wants GPUs one, named: the first this host
    shows (CUDA_VISIBLE_DEVICES), never every GPU of the host."""
    settings = server.container
    shm_size = settings.get("shm_size")
    if not shm_size and not settings["ipc_host"]:
        largest = largest_tensor_bytes(workload_manifest)
        shm_size = f"{shared_memory_bytes(largest, arm.concurrency) // MIB}m"
    gpus = settings["gpus"]
    if gpus == "auto":
        gpus = f"device={first_visible_gpu()}" if command.wants_gpus else None
    return ContainerOptions(
        runtime=server.runtime,
        image=read_image_id(server.image_id_file),
        shm_size=None if settings["ipc_host"] else shm_size,
        ipc_host=settings["ipc_host"],
        gpus=None if gpus == "none" else gpus,
        read_only_mounts=command.read_only_mounts,
        writable_mounts=command.writable_mounts,
    )


def first_visible_gpu() -> str:
    """The first GPU this process may use: CUDA_VISIBLE_DEVICES's first index, or 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible if visible.isdigit() else "0"


def largest_tensor_bytes(workload_manifest: Path) -> int:
    """The largest image tensor of a workload (its manifest lists each image)."""
    manifest = json.loads(Path(workload_manifest).read_text())
    return max(
        feature_bytes(image["height"], image["width"]) for image in manifest["images"]
    )


def shared_memory_bytes(largest_tensor: int, concurrency: int) -> int:
    """A /dev/shm size that never runs out under the arm's load, in whole MiB.

    Each request in flight holds one segment until the scheduler has read it, and a
    read segment stays charged to /dev/shm while the scheduler maps it: two per
    request at most, plus headroom. tmpfs takes memory only when used, so the
    generous size costs nothing.
    """
    needed = 2 * concurrency * largest_tensor + SHARED_MEMORY_HEADROOM
    return max(SHARED_MEMORY_MINIMUM, math.ceil(needed / MIB) * MIB)
