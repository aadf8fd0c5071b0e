"""Helpers the whole-workflow and arm tests share."""

import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
TEST_CONFIG = ROOT / "config" / "test" / "config.yaml"


def snakemake_command(
    workdir: Path, *arguments: str, config: Path | tuple[Path, ...] = TEST_CONFIG
) -> list[str]:
    """This workflow's Snakemake on ``config`` (one file, or several merged in
    order), working in ``workdir``. The config files come last, so that no target
    among ``arguments`` is taken for one."""
    configs = config if isinstance(config, tuple) else (config,)
    return [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        *arguments,
        "--configfile",
        *(str(path) for path in configs),
    ]


def leaked_segments() -> list[Path]:
    """SGLang segments whose creating process is gone (live ones are others')."""
    return [
        path
        for path in Path("/dev/shm").glob("sgl_shm_*")
        if not psutil.pid_exists(int(path.name.split("_")[-2]))
    ]


def docker(*arguments: str, check: bool = True) -> subprocess.CompletedProcess:
    """The docker client (its DOCKER_HOST from the environment), output captured."""
    return subprocess.run(
        ["docker", *arguments], capture_output=True, text=True, check=check
    )
