"""The SLURM profile's resource requests, adapted to the local test cluster.

Prints one command-line argument per line: `--default-resources` and
`--set-resources` with every rule and resource of profiles/slurm/profile.yaml, where
only what this one node cannot give is changed: the partition is `local`, no GPU is
asked for, a CPU count becomes the node's CPU count (the profile asks for the whole
node), and memory is capped at the node's. Everything else (which rules get a
request, `--exclusive`, runtimes) is the profile's own.

    python tests/slurm/local_resources.py profiles/slurm/profile.yaml
"""

import subprocess
import sys
from pathlib import Path

import yaml

LOCAL_PARTITION = "local"
GPU_RESOURCES = ("gpu", "gpus", "gpu_model", "gres")
CPU_RESOURCES = ("cpus_per_task", "cpus_per_gpu")


def node_cpus_and_memory_mb() -> tuple[int, int]:
    """CPUs and memory (MB) of the test cluster's node, as SLURM reports them."""
    answer = subprocess.run(
        ["sinfo", "--noheader", "--format=%c %m"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(answer[0]), int(answer[1])


def as_argument(value) -> str:
    """A resource value as Snakemake reads it: strings quoted, numbers bare.

    The profile already quotes strings that Snakemake would otherwise read as an
    expression (slurm_extra: "'--exclusive'"); those are passed on as they are.
    """
    if not isinstance(value, str):
        return str(value)
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value
    return f"'{value}'"


def adapted(resources: dict, cpus: int, memory_mb: int) -> dict:
    local = {}
    for name, value in resources.items():
        if name in GPU_RESOURCES:
            continue
        if name in CPU_RESOURCES:
            local["cpus_per_task"] = cpus
        elif name == "mem_mb":
            local[name] = min(int(value), memory_mb)
        elif name == "slurm_partition":
            local[name] = LOCAL_PARTITION
        else:
            local[name] = value
    return local


def local_arguments(profile: dict, cpus: int, memory_mb: int) -> list[str]:
    defaults = adapted(profile.get("default-resources", {}), cpus, memory_mb)
    defaults.pop("slurm_account", None)
    arguments = ["--default-resources"]
    arguments += [f"{name}={as_argument(value)}" for name, value in defaults.items()]
    arguments.append("--set-resources")
    for rule, resources in profile.get("set-resources", {}).items():
        for name, value in adapted(resources, cpus, memory_mb).items():
            arguments.append(f"{rule}:{name}={as_argument(value)}")
    return arguments


def main() -> None:
    profile = yaml.safe_load(Path(sys.argv[1]).read_text())
    cpus, memory_mb = node_cpus_and_memory_mb()
    print("\n".join(local_arguments(profile, cpus, memory_mb)))


if __name__ == "__main__":
    main()
