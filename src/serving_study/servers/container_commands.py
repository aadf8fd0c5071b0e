"""The docker/podman command line that starts one arm's container, and its options.

Built from the arm alone: the container runs detached, on the host's network (the
server binds 127.0.0.1 on a free port and the client stays outside), with the arm's
quota as ``--cpus``, the arm's environment and nothing else of the host's, a
``/dev/shm`` sized for the workload's largest tensor (Docker's default 64 MiB would
silently push SGLang off the shared-memory path under study) or the host's IPC
namespace, GPUs when asked, and read-only mounts (the model). Labels name the run and
the runner that owns the container; image ids are read in either runtime's spelling.
``QUOTA_INSIDE_SCRIPT`` reads the quota as the container's processes see it, and
``parse_quota`` reads its output.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

from serving_study.config.platform import SGLangPlatform
from serving_study.servers.host import feature_bytes

RUNTIMES = ("docker", "podman")
# Least privilege: neither engine needs a capability (servers run as the image's
# root, bind ports above 1024 on the host's network, write /dev/shm, /tmp and the
# root-owned compile cache, and signal only their own processes), and nothing in
# a container may gain privileges (setuid binaries) after it starts.
LEAST_PRIVILEGE = ("--cap-drop", "ALL", "--security-opt", "no-new-privileges")
# An image id as docker writes it; podman may leave out the "sha256:".
IMAGE_ID = re.compile(r"(?:sha256:)?([0-9a-f]{64})")
RUN_LABEL = "serving-study.run"
# The pid of the runner that started the container: once it is gone, the
# container is a leftover (leftovers.py removes it).
OWNER_LABEL = "serving-study.owner"
MIB = 1 << 20
# Room in /dev/shm besides the image tensors (torch and SGLang keep a little there).
SHARED_MEMORY_HEADROOM = 256 * MIB
SHARED_MEMORY_MINIMUM = 1024 * MIB
# Reads the quota as the processes inside see it (cgroup v2, else v1).
QUOTA_INSIDE_SCRIPT = (
    "cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo "
    "$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) "
    "$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"
)


class ContainerCommandFailed(RuntimeError):
    """A docker/podman command the runner relies on failed; the message says which."""


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


def container_options(
    settings: dict,
    platform: SGLangPlatform | None,
    concurrency: int,
    workload_manifest: Path,
) -> dict:
    """``shm_size``, ``ipc_host`` and ``gpus`` of one arm's container, from the
    config's ``container`` section (see config.schema.yaml).

    ``platform`` is where a real SGLang server runs, None for the embedded engine;
    ``gpus: auto`` gives all GPUs only when it wants them (a GPU host), none on CPU.
    """
    shm_size = settings.get("shm_size")
    if not shm_size and not settings["ipc_host"]:
        size = shared_memory_bytes(largest_tensor_bytes(workload_manifest), concurrency)
        shm_size = f"{size // MIB}m"
    gpus = settings["gpus"]
    if gpus == "auto":
        gpus = "all" if platform is not None and platform.container_gpus else "none"
    return {"shm_size": shm_size, "ipc_host": settings["ipc_host"], "gpus": gpus}


def read_image_id(image_id_file: str | Path) -> str:
    """The image id a build wrote with --iidfile (``sha256:...``)."""
    text = Path(image_id_file).read_text().strip()
    image_id = normal_image_id(text)
    if image_id is None:
        raise ContainerCommandFailed(
            f"{image_id_file} holds {text[:80]!r}, not an image id (sha256:...); "
            "build the image again"
        )
    return image_id


def normal_image_id(text: str) -> str | None:
    """``sha256:<64 hex>`` from an image id in either runtime's spelling, or None
    (a tag is not an id)."""
    matched = IMAGE_ID.fullmatch(text.strip())
    return f"sha256:{matched.group(1)}" if matched else None


def gpu_options(runtime: str, gpus: str | None) -> list[str]:
    """``--gpus`` for docker; podman names NVIDIA GPUs as CDI devices instead."""
    if not gpus or gpus == "none":
        return []
    if runtime == "docker":
        # docker reads --gpus as CSV: a device list must be one quoted field.
        return ["--gpus", f'"{gpus}"' if "," in gpus else gpus]
    devices = ["all"] if gpus == "all" else gpus.removeprefix("device=").split(",")
    return [
        option
        for device in devices
        for option in ("--device", f"nvidia.com/gpu={device}")
    ]


def container_name(group_name: str) -> str:
    """A container name from the run's group name, in the characters names allow."""
    return "serving-study-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", group_name)


def run_command(
    *,
    runtime: str,
    image: str,
    command: list[str],
    name: str,
    label: str,
    environment: dict[str, str],
    quota_cores: float | None,
    shm_size: str | None,
    passed_environment: Sequence[str] = (),
    ipc_host: bool = False,
    gpus: str | None = None,
    read_only_mounts: Sequence[tuple[str, str]] = (),
    writable_mounts: Sequence[tuple[str, str]] = (),
    stop_signal: str | None = None,
) -> list[str]:
    """``docker run --detach`` (or ``podman run``) of ``command`` in ``image``.

    ``quota_cores`` None starts the container without a quota (``apply_quota`` adds
    it later); ``shm_size`` is the size of a private /dev/shm (e.g. ``"2048m"``),
    unused when ``ipc_host`` shares the host's. ``passed_environment`` names
    variables the container gets from the runtime client's environment (secrets:
    ``--env NAME``, so no value is on the command line or in its records).
    ``stop_signal`` is what ``docker stop`` sends first (the image's, SIGTERM,
    when None).
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r} is not one of {RUNTIMES}")
    argv = [
        runtime,
        "run",
        "--detach",
        "--name",
        name,
        "--label",
        f"{RUN_LABEL}={label}",
        "--label",
        f"{OWNER_LABEL}={os.getpid()}",
    ]
    log_driver = "json-file" if runtime == "docker" else "k8s-file"
    argv += ["--network=host", f"--log-driver={log_driver}", *LEAST_PRIVILEGE]
    if quota_cores is not None:
        argv += ["--cpus", f"{quota_cores:g}"]
    if ipc_host:
        argv.append("--ipc=host")
    elif shm_size:
        argv += ["--shm-size", shm_size]
    argv += gpu_options(runtime, gpus)
    if stop_signal is not None:
        argv += ["--stop-signal", stop_signal]
    for host_path, container_path in read_only_mounts:
        argv += ["--volume", f"{host_path}:{container_path}:ro"]
    for host_path, container_path in writable_mounts:
        argv += ["--volume", f"{host_path}:{container_path}:rw"]
    for variable, value in sorted(environment.items()):
        argv += ["--env", f"{variable}={value}"]
    for variable in passed_environment:
        argv += ["--env", variable]
    return argv + ["--", image, *command]


def parse_quota(text: str) -> dict:
    """``cpu.max`` text (``"max 100000"``, ``"50000 100000"``; v1 ``"-1 100000"``)."""
    quota_text, period_text = text.split()
    period_us = int(period_text)
    quota_us = None if quota_text in ("max", "-1") else int(quota_text)
    return {
        "quota_us": quota_us,
        "period_us": period_us,
        "cores": None if quota_us is None else quota_us / period_us,
    }
