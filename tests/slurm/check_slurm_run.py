"""Checks a run of the study through SLURM against a local run of the same config.

SLURM itself is asked which jobs ran: the executor plugin names every job of one
Snakemake run after the run's id and puts `rule_<rule>_wildcards_<values>` in the
job's comment, which `squeue --states=all` shows while slurmctld keeps finished jobs,
and `sacct --completion` lists each job's end state from the job completion log.
Then the two runs' results must hold the same files, every run must be valid with
the quota its arm asks for, and the report must be there.

    python tests/slurm/check_slurm_run.py --slurm-run DIR --local-run DIR \
        --snakemake-log FILE --experiment test-embedded
"""

import argparse
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

REMOTE_RULES = {"preflight", "run_arm"}


class CheckFailed(AssertionError):
    """The SLURM run differs from what the profile promises; the message says how."""


def slurm_run_id(snakemake_log: str) -> str:
    match = re.search(r"SLURM run ID: (\S+)", snakemake_log)
    if match is None:
        raise CheckFailed(
            "the Snakemake log names no SLURM run ID: was it a SLURM run?"
        )
    return match.group(1)


def slurm_jobs(run_id: str) -> list[dict]:
    """Every SLURM job of the run: id, rule, wildcards, state, node."""
    listing = subprocess.run(
        [
            "squeue",
            "--states=all",
            "--noheader",
            f"--name={run_id}",
            "--format=%i|%k|%T|%N",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    jobs = []
    for line in listing.splitlines():
        job_id, comment, state, node = line.split("|")
        match = re.fullmatch(r"rule_(.+?)(?:_wildcards_(.*))?", comment)
        if match is None:
            raise CheckFailed(
                f"SLURM job {job_id} has no rule in its comment {comment}"
            )
        jobs.append(
            {
                "job_id": job_id,
                "rule": match.group(1),
                "wildcards": match.group(2) or "",
                "state": state,
                "node": node,
            }
        )
    return jobs


COMPLETION_FIELDS = [
    "JobID",
    "Partition",
    "State",
    "NodeList",
    "AllocCPUS",
    "Start",
    "End",
    "Elapsed",
]


def completion_records(job_ids: list[str]) -> dict[str, dict]:
    """Each job's record in SLURM's job completion log (`sacct --completion`)."""
    listing = subprocess.run(
        [
            "sacct",
            "--completion",
            "--parsable2",
            "--noheader",
            f"--format={','.join(COMPLETION_FIELDS)}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    records = {}
    for line in listing.splitlines():
        record = dict(zip(COMPLETION_FIELDS, line.split("|"), strict=True))
        if record["JobID"] in job_ids:
            records[record["JobID"]] = record
    return records


def print_table(records: list[dict]) -> None:
    widths = {
        field: max([len(field)] + [len(record[field]) for record in records])
        for field in COMPLETION_FIELDS
    }
    for row in [{field: field for field in COMPLETION_FIELDS}, *records]:
        print(
            "  "
            + "  ".join(row[field].ljust(widths[field]) for field in COMPLETION_FIELDS)
        )


def result_files(workdir: Path, experiment: str) -> set[str]:
    root = workdir / "results" / experiment
    return {str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()}


def arm_runs(workdir: Path, experiment: str) -> list[tuple[str, int]]:
    """(arm, run) of every measured run, from the run directories."""
    root = workdir / "results" / experiment
    return sorted(
        (path.parent.parent.name, int(path.parent.name.removeprefix("run")))
        for path in root.glob("*/run*/metrics.json")
    )


def table_header(path: Path) -> list[str]:
    with path.open() as table:
        return next(csv.reader(table))


def check(slurm_run: Path, local_run: Path, snakemake_log: Path, experiment: str):
    run_id = slurm_run_id(snakemake_log.read_text())
    jobs = slurm_jobs(run_id)
    print(f"SLURM run {run_id}: {len(jobs)} jobs")
    for job in jobs:
        print(
            f"  job {job['job_id']}: rule {job['rule']} [{job['wildcards']}] "
            f"{job['state']} on {job['node']}"
        )
    records = completion_records([job["job_id"] for job in jobs])
    print("sacct --completion (SLURM's job completion log):")
    print_table([records[job["job_id"]] for job in jobs if job["job_id"] in records])

    submitted_rules = {job["rule"] for job in jobs}
    if submitted_rules != REMOTE_RULES:
        raise CheckFailed(
            f"the rules run as SLURM jobs were {sorted(submitted_rules)}, "
            f"expected exactly {sorted(REMOTE_RULES)}"
        )
    not_completed = {
        job["job_id"]: (job["state"], records.get(job["job_id"], {}).get("State"))
        for job in jobs
        if job["state"] != "COMPLETED"
        or records.get(job["job_id"], {}).get("State") != "COMPLETED"
    }
    if not_completed:
        raise CheckFailed(f"jobs not COMPLETED (squeue, sacct): {not_completed}")

    expected_runs = arm_runs(local_run, experiment)
    arm_jobs = sorted(job["wildcards"] for job in jobs if job["rule"] == "run_arm")
    expected_jobs = sorted(f"{experiment}_{arm}_{run}" for arm, run in expected_runs)
    if arm_jobs != expected_jobs:
        raise CheckFailed(
            f"run_arm SLURM jobs {arm_jobs}, but the local run measured {expected_jobs}"
        )

    slurm_files = result_files(slurm_run, experiment)
    local_files = result_files(local_run, experiment)
    if slurm_files != local_files:
        raise CheckFailed(
            f"results differ: only in the SLURM run {sorted(slurm_files - local_files)}"
            f", only in the local run {sorted(local_files - slurm_files)}"
        )
    tables = sorted(name for name in slurm_files if name.endswith(".csv"))
    for name in tables:
        slurm_header = table_header(slurm_run / "results" / experiment / name)
        if slurm_header != table_header(local_run / "results" / experiment / name):
            raise CheckFailed(f"table {name} has other columns than the local run's")

    for arm, run in expected_runs:
        run_dir = slurm_run / "results" / experiment / arm / f"run{run}"
        metrics = json.loads((run_dir / "metrics.json").read_text())
        if not metrics["valid"]:
            raise CheckFailed(
                f"{arm} run {run} is invalid: {metrics['invalid_reasons']}"
            )
        provenance = json.loads((run_dir / "provenance.json").read_text())
        asked = provenance["arm"]["cpu_quota"]
        in_force = provenance["quota_in_force"]["cores"]
        if (None if asked == "none" else float(asked)) != in_force:
            raise CheckFailed(
                f"{arm} run {run}: quota in force {in_force}, the arm asks for {asked}"
            )
        group = provenance["quota_in_force"]["directories"]
        print(
            f"  {arm} run {run}: valid, {metrics['throughput_rps']:.2f} req/s, "
            f"quota in force {in_force} cores in {group}"
        )
    host = json.loads((slurm_run / "results" / experiment / "host.json").read_text())
    print(
        f"  preflight in its SLURM job: {host['visible_cpus']} of {host['cpu_count']} "
        f"CPUs visible, intra-op threads per arm "
        f"{[arm['intra_op_threads'] for arm in host['arms']]}"
    )
    report = slurm_run / "results" / experiment / "report.html"
    if report.stat().st_size == 0:
        raise CheckFailed("the report page is empty")
    print(
        f"same {len(slurm_files)} result files as the local run, {len(tables)} tables "
        f"with the same columns, report {report.stat().st_size} bytes"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slurm-run", type=Path, required=True)
    parser.add_argument("--local-run", type=Path, required=True)
    parser.add_argument("--snakemake-log", type=Path, required=True)
    parser.add_argument("--experiment", required=True)
    arguments = parser.parse_args()
    try:
        check(
            arguments.slurm_run,
            arguments.local_run,
            arguments.snakemake_log,
            arguments.experiment,
        )
    except CheckFailed as failure:
        sys.exit(f"SLURM run check failed: {failure}")
    print("SLURM run check passed")


if __name__ == "__main__":
    main()
