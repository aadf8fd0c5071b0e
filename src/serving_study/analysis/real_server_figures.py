"""Figures of the real SGLang server from a finished study: what an arm costs.

From each arm's runs (their metrics and provenance): server start to healthy, the
arm's overhead (its wall time beyond the measured window: start, warm-up,
teardown), and the main process's and the scheduler's CPU per request. Then the
main process's CPU per request is split into the image processor, the SHM copy and
the rest, with those two steps as measured again, alone, in the arm's runtime
(``studies/main_process_steps.py``).
"""

import json
import statistics
from pathlib import Path


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
