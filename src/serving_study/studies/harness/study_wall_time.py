"""The wall time of the whole default study, from its jobs' own records.

Every rule of a study but ``run_arm`` declares a ``benchmark:`` file under
``results/benchmarks/jobs/<rule>/``, in which Snakemake writes the job's wall
seconds (column ``s``). A run's job has none, because Snakemake's benchmark samples
the job's process tree, the server's included, while it measures; each run's
``provenance.json`` holds its wall time (``wall_s``) instead. With ``--cores 1``
the jobs run one after another, so the study costs the sum of these seconds,
Snakemake's own start-up of a few seconds and each run job's Python start aside.
"""

import csv
import json
import statistics
from pathlib import Path

JOB_BENCHMARKS = Path("results/benchmarks/jobs")


def job_seconds(benchmark: Path) -> float:
    """The wall seconds Snakemake measured for one job (its last repeat)."""
    with Path(benchmark).open(newline="") as table:
        rows = list(csv.DictReader(table, delimiter="\t"))
    return float(rows[-1]["s"])


def rule_of(benchmark: Path) -> str:
    """The rule a job's benchmark file belongs to: the folder under ``jobs/``."""
    parts = Path(benchmark).parts
    return parts[parts.index(JOB_BENCHMARKS.name) + 1]


def run_seconds(provenance: Path) -> float:
    """The wall time one run recorded (``provenance.json``'s ``wall_s``)."""
    return float(json.loads(Path(provenance).read_text())["wall_s"])


def default_study_wall(benchmarks: list[Path], run_provenances: list[Path]) -> dict:
    """The default study's wall time on this host: the sum of its jobs' seconds and
    its runs' wall times, and the seconds of each rule."""
    missing = [
        path for path in [*benchmarks, *run_provenances] if not Path(path).is_file()
    ]
    if missing:
        return {
            "default_study_wall_s": None,
            "reason": f"{len(missing)} jobs of the default study have no record "
            f"(first: {missing[0]}): run `snakemake --cores 1 all`",
        }
    if not run_provenances:
        return {"default_study_wall_s": None, "reason": "the study has no runs"}
    by_rule: dict[str, float] = {}
    for path in benchmarks:
        rule = rule_of(path)
        by_rule[rule] = by_rule.get(rule, 0.0) + job_seconds(path)
    by_rule["run_arm"] = sum(run_seconds(path) for path in run_provenances)
    return {
        "default_study_wall_s": round(sum(by_rule.values()), 1),
        "jobs": len(benchmarks) + len(run_provenances),
        "seconds_by_rule": {rule: round(s, 1) for rule, s in sorted(by_rule.items())},
        "source": f"{JOB_BENCHMARKS} and each run's provenance.json",
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
