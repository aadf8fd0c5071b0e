"""Helpers the whole-workflow and arm tests share."""

import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
TEST_CONFIG = ROOT / "config" / "test" / "config.yaml"


def snakemake_command(
    workdir: Path, *arguments: str, config: Path = TEST_CONFIG
) -> list[str]:
    """This workflow's Snakemake on ``config``, working in ``workdir``."""
    return [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(config),
        *arguments,
    ]


def leaked_segments() -> list[Path]:
    """SGLang segments whose creating process is gone (live ones are others')."""
    return [
        path
        for path in Path("/dev/shm").glob("sgl_shm_*")
        if not psutil.pid_exists(int(path.name.split("_")[-2]))
    ]
