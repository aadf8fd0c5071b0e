"""The wall time of the whole default study, from Snakemake's job records."""

from __future__ import annotations

import base64
import json
import statistics
from datetime import datetime
from pathlib import Path


def snakemake_records(metadata_dir: Path, outputs: list[str]) -> dict[str, dict]:
    """Snakemake's record of each listed output that has one (.snakemake/metadata).

    Snakemake keeps one record per output file, named by the urlsafe base64 of the
    path (split into `@`-prefixed directories when longer than a file name may be).
    """
    wanted = set(outputs)
    records = {}
    for record_path in Path(metadata_dir).rglob("*"):
        if not record_path.is_file():
            continue
        parts = record_path.relative_to(metadata_dir).parts
        encoded = "".join(part.removeprefix("@") for part in parts)
        try:
            output = base64.urlsafe_b64decode(encoded).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        if output not in wanted:
            continue
        try:
            record = json.loads(record_path.read_text())
        except (ValueError, OSError):
            continue
        if record.get("starttime") is not None and record.get("endtime") is not None:
            records[output] = record
    return records


def jobs_of(records: dict[str, dict]) -> list[dict]:
    """One entry per job (the outputs of one job share its rule and log), by start."""
    jobs: dict[tuple, dict] = {}
    for output, record in records.items():
        key = (record.get("rule"), tuple(record.get("log") or [output]))
        job = jobs.setdefault(
            key, {"rule": record.get("rule"), "start": record["starttime"], "end": 0}
        )
        job["start"] = min(job["start"], record["starttime"])
        job["end"] = max(job["end"], record["endtime"])
    return sorted(jobs.values(), key=lambda job: job["start"])


def default_study_wall(
    metadata_dir: Path, study_outputs: list[str], max_gap_s: float = 30.0
) -> dict:
    """The default study's wall time on this host, from the last run of each job.

    `study_outputs` names one output of every job of the study. With `--cores 1`
    the jobs run one after another, so the study costs the sum of its jobs'
    durations (Snakemake's own start-up of a few seconds aside). The span of the
    last uninterrupted stretch of jobs tells whether they all ran in one go.
    """
    if not Path(metadata_dir).is_dir():
        return {
            "default_study_wall_s": None,
            "reason": f"no {metadata_dir}: the default study never ran here",
        }
    records = snakemake_records(metadata_dir, study_outputs)
    missing = sorted(set(study_outputs) - set(records))
    if missing:
        return {
            "default_study_wall_s": None,
            "reason": f"{len(missing)} outputs of the default study have no record "
            f"in {metadata_dir} (first: {missing[0]}): run `snakemake --cores 1 all`",
        }
    jobs = jobs_of(records)
    stretch = [jobs[0]]
    for job in jobs[1:]:
        if job["start"] - max(j["end"] for j in stretch) > max_gap_s:
            stretch = []
        stretch.append(job)
    by_rule: dict[str, float] = {}
    for job in jobs:
        by_rule[job["rule"]] = by_rule.get(job["rule"], 0.0) + job["end"] - job["start"]
    return {
        "default_study_wall_s": round(sum(j["end"] - j["start"] for j in jobs), 1),
        "jobs": len(jobs),
        "seconds_by_rule": {rule: round(s, 1) for rule, s in sorted(by_rule.items())},
        "last_stretch_span_s": round(
            max(j["end"] for j in stretch) - stretch[0]["start"], 1
        ),
        "last_stretch_jobs": len(stretch),
        "first_job_started": _iso(jobs[0]["start"]),
        "last_job_ended": _iso(max(job["end"] for job in jobs)),
        "source": str(metadata_dir),
    }


def with_current_arm_overhead(
    study: dict, run_directories: list[Path], arm_overhead_s: float | None
) -> dict:
    """The recorded study's wall time if its runs had today's arm overhead.

    Each recorded run's overhead is its `provenance.json` wall time minus its
    measured window (`metrics.json`); the estimate swaps them for the overhead
    just measured, keeping every measured window and every other job as recorded.
    """
    overheads = []
    for directory in run_directories:
        try:
            wall = json.loads((directory / "provenance.json").read_text())["wall_s"]
            measured = json.loads((directory / "metrics.json").read_text())
        except (OSError, ValueError, KeyError):
            continue
        if measured.get("measured_seconds"):
            overheads.append(wall - measured["measured_seconds"])
    if study.get("default_study_wall_s") is None or not overheads or not arm_overhead_s:
        return study
    estimate = study["default_study_wall_s"] - sum(overheads)
    estimate += len(overheads) * arm_overhead_s
    return {
        **study,
        "recorded_arm_overhead_s_median": round(statistics.median(overheads), 3),
        "recorded_runs": len(overheads),
        "estimated_wall_s_with_measured_arm_overhead": round(estimate, 1),
    }


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")
