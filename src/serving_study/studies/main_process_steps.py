"""Measures the real server's main-process steps again, alone, in its own runtime.

The image processor's and the SHM copy's CPU per image, with the arm's variant and
thread knobs: ``main_process_costs.py`` beside this module, run by file path with
the server's runtime Python. ``analysis/real_server_figures.py`` splits an arm's
main-process CPU per request with these figures.
"""

import json
import os
import subprocess
from pathlib import Path

from serving_study.servers.environment import server_environment

COSTS_SCRIPT = Path(__file__).with_name("main_process_costs.py")


def measure_main_process_steps(
    *,
    runtime_python: str,
    python_path: str,
    arm_environment: dict[str, str],
    model_directory: Path,
    images: list[Path],
) -> dict:
    """The processor's and the SHM copy's CPU per image, in the server's runtime,
    with the arm's thread knobs (and none of this process's)."""
    environment = server_environment(os.environ, arm_environment)
    environment["PYTHONPATH"] = python_path
    finished = subprocess.run(
        # -P: the script's own folder (this package's studies/) must not go first on
        # the path, where a module of ours could shadow the standard library's or
        # the runtime's.
        [runtime_python, "-P", str(COSTS_SCRIPT), str(model_directory)]
        + [str(image) for image in images],
        capture_output=True,
        text=True,
        env=environment,
        timeout=900,
        check=False,
    )
    if finished.returncode != 0:
        raise RuntimeError(
            f"measuring the main process's steps failed:\n{finished.stderr[-3000:]}"
        )
    return json.loads(finished.stdout.strip().splitlines()[-1])
