"""Figures of the real SGLang server from a finished study: what an arm costs.

From each arm's runs (their metrics and provenance): server start to healthy, the
arm's overhead (its wall time beyond the measured window: start, warm-up,
teardown), and the main process's and the scheduler's CPU per request. Then the
main process's CPU per image is split by measuring its two big steps again, alone,
in the same runtime with the arm's variant and thread knobs
(``main_process_costs.py``): the image processor, the SHM copy, and the rest.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

from serving_study.servers.environment import THREAD_SETTINGS

COSTS_SCRIPT = Path(__file__).with_name("main_process_costs.py")


def _median(values: list[float]) -> float | None:
    values = [value for value in values if value is not None]
    return statistics.median(values) if values else None


def arm_run_figures(run_directories: list[Path]) -> dict:
    """Medians over an arm's valid runs (None where no valid run has a value)."""
    rows = []
    for directory in run_directories:
        metrics = json.loads((directory / "metrics.json").read_text())
        provenance = json.loads((directory / "provenance.json").read_text())
        if not metrics.get("valid"):
            continue
        rows.append(
            {
                "start_to_healthy_s": provenance.get("start_to_healthy_s"),
                "arm_overhead_s": provenance["wall_s"] - metrics["measured_seconds"],
                "main_cpu_ms_per_request": metrics["main_cpu_ms_per_request"],
                "scheduler_cpu_ms_per_request": metrics["scheduler_cpu_ms_per_request"],
            }
        )
    figures = {"valid_runs": len(rows)}
    for key in (
        "start_to_healthy_s",
        "arm_overhead_s",
        "main_cpu_ms_per_request",
        "scheduler_cpu_ms_per_request",
    ):
        figures[key] = _median([row[key] for row in rows])
    return figures


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
    environment = {
        name: value for name, value in os.environ.items() if name not in THREAD_SETTINGS
    }
    environment.update(arm_environment)
    environment["PYTHONPATH"] = python_path
    finished = subprocess.run(
        # -P: the script's own folder (this package's analysis/) must not go first
        # on the path, where its numbers.py would shadow the standard library's.
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


def split_of_main_cpu(run_figures: dict, steps: dict) -> dict:
    """The main process's CPU per request as processor + SHM copy + the rest."""
    total = run_figures["main_cpu_ms_per_request"]
    processor = steps["processor_cpu_ms_per_image"]
    copy = steps["shm_copy_cpu_ms_per_image"]
    return {
        "main_cpu_ms_per_request": total,
        "processor_cpu_ms": processor,
        "shm_copy_cpu_ms": copy,
        "rest_cpu_ms": None if total is None else total - processor - copy,
        "torch_threads": steps["torch_threads"],
    }
