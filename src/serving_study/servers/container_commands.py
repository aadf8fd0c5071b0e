"""The docker/podman command line that runs one plan's server in its container.

From the launch plan alone, adding only the run's own name and labels: the
container runs detached, on the host's network (the server binds 127.0.0.1 on the
run's port and the client stays outside), with the plan's quota as ``--cpus`` when
it is in force from the start, its environment and nothing else of the host's
(secrets by name), its /dev/shm or the host's IPC namespace, its GPUs and mounts.
Labels name the run and the runner that owns the container.
"""

from __future__ import annotations

import re

from serving_study.launch.plan import LaunchPlan
from serving_study.servers.owners import owner_token

RUNTIMES = ("docker", "podman")
# Least privilege: neither engine needs a capability (servers run as the image's
# root, bind ports above 1024 on the host's network, write /dev/shm, /tmp and the
# root-owned compile cache, and signal only their own processes), and nothing in
# a container may gain privileges (setuid binaries) after it starts.
LEAST_PRIVILEGE = ("--cap-drop", "ALL", "--security-opt", "no-new-privileges")
# Nothing but the mounts, /dev/shm and a scratch /tmp may be written (the plan
# points HOME there), and a runaway tree cannot exhaust the host's pids: SGLang's
# processes hold a few hundred threads between them.
CONFINED = (
    "--read-only",
    "--tmpfs",
    "/tmp:rw,exec,nosuid,nodev,size=4g",
    "--pids-limit",
    "4096",
)
RUN_LABEL = "serving-study.run"
# The runner that started the container (owners.py): once it is gone, the
# container is a leftover (leftovers.py removes it).
OWNER_LABEL = "serving-study.owner"
# Reads the quota as the processes inside see it (cgroup v2, else v1).
QUOTA_INSIDE_SCRIPT = (
    "cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo "
    "$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) "
    "$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"
)


class ContainerCommandFailed(RuntimeError):
    """A docker/podman command the runner relies on failed; the message says which."""


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


def run_command(plan: LaunchPlan, name: str, label: str) -> list[str]:
    """``docker run --detach`` (or ``podman run``) of the plan's command."""
    container = plan.container
    runtime = container.runtime
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r} is not one of {RUNTIMES}")
    argv = [runtime, "run", "--detach", "--name", name]
    argv += ["--label", f"{RUN_LABEL}={label}"]
    argv += ["--label", f"{OWNER_LABEL}={owner_token()}"]
    log_driver = "json-file" if runtime == "docker" else "k8s-file"
    argv += ["--network=host", f"--log-driver={log_driver}", *LEAST_PRIVILEGE]
    argv += CONFINED
    if plan.quota.cores is not None and plan.quota.from_start:
        argv += ["--cpus", f"{plan.quota.cores:g}"]
    if container.ipc_host:
        argv.append("--ipc=host")
    elif container.shm_size:
        argv += ["--shm-size", container.shm_size]
    argv += gpu_options(runtime, container.gpus)
    argv += ["--stop-signal", plan.stop_signal]
    for host_path, container_path in container.read_only_mounts:
        argv += ["--volume", f"{host_path}:{container_path}:ro"]
    for host_path, container_path in container.writable_mounts:
        argv += ["--volume", f"{host_path}:{container_path}:rw"]
    for variable, value in sorted(plan.environment.items()):
        argv += ["--env", f"{variable}={value}"]
    for variable in plan.secret_environment:
        argv += ["--env", variable]
    return argv + ["--", container.image, *plan.command()]


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
