"""The workflow as Snakemake sees it: lint, format, style, and every config's DAG."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(
    str(path.relative_to(ROOT))
    for path in (ROOT / "config").rglob("*.yaml")
    if path.name != "config.schema.yaml"
)


def run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True)


def snakemake(*arguments: str) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "snakemake", *arguments)


def test_snakemake_lint_is_clean():
    finished = snakemake("--lint")
    assert finished.returncode == 0, finished.stdout + finished.stderr


def test_snakefmt_is_clean():
    finished = run(sys.executable, "-m", "snakefmt", "--check", ".")
    assert finished.returncode == 0, finished.stdout + finished.stderr


def test_ruff_is_clean():
    lint = run(sys.executable, "-m", "ruff", "check", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    formatting = run(sys.executable, "-m", "ruff", "format", "--check", ".")
    assert formatting.returncode == 0, formatting.stdout + formatting.stderr


def planned_jobs(*arguments: str) -> dict[str, int]:
    """Rule name -> job count of a dry run, read from Snakemake's job table."""
    finished = snakemake("-n", *arguments)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    counts, in_table = {}, False
    for line in finished.stdout.splitlines():
        if line.startswith("job ") and "count" in line:
            in_table = True
            continue
        if in_table:
            fields = line.split()
            if not fields or fields[0] == "total":
                break
            if fields[0].startswith("-"):
                continue
            counts[fields[0]] = int(fields[1])
    return counts


@pytest.mark.parametrize("config", CONFIGS)
def test_dry_run_shows_every_arm_and_run(config, tmp_path):
    import yaml

    experiment = yaml.safe_load((ROOT / config).read_text())
    expected_runs = sum(arm.get("runs", 3) for arm in experiment["arms"])
    jobs = planned_jobs(
        "--directory",
        str(tmp_path),
        "-s",
        str(ROOT / "Snakefile"),
        "--configfile",
        str(ROOT / config),
    )
    assert jobs["run_arm"] == expected_runs
    assert jobs["prepare_variant"] == len(experiment["variants"])
    assert jobs["make_workload"] == len(experiment["workloads"])
    assert jobs["report_html"] == 1


def test_naming_one_run_schedules_only_that_run_and_what_it_lacks(tmp_path):
    target = "results/embedded-b1/C/run2/metrics.json"
    jobs = planned_jobs(
        "--directory", str(tmp_path), "-s", str(ROOT / "Snakefile"), target
    )
    assert jobs == {
        "fetch_source": 1,
        "prepare_variant": 1,
        "make_workload": 1,
        "preflight": 1,
        "arm_preflight": 1,
        "launch_plan": 1,
        "run_arm": 1,
    }


def planned_job_fields(output: str) -> list[tuple[str, dict[str, str]]]:
    """Each job of a dry run's plan, in order: its rule and its fields as Snakemake
    prints them (input, output, wildcards, ...)."""
    jobs: list[tuple[str, dict[str, str]]] = []
    for line in output.splitlines():
        if line.startswith(("rule ", "localrule ")):
            jobs.append((line.split()[1].rstrip(":"), {}))
        elif jobs and line.startswith("    ") and ": " in line:
            key, value = line.strip().split(": ", 1)
            jobs[-1][1][key] = value
    return jobs


def test_b1s_pull_request_variant_is_prepared_from_its_own_source():
    import yaml

    from serving_study.config.content_keys import content_key

    b1 = yaml.safe_load((ROOT / "config/b1.yaml").read_text())
    (variant,) = [v for v in b1["variants"] if v["name"] == "pr48881"]
    (source,) = [s for s in b1["sources"] if s["name"] == variant["source"]]
    # Fetched into a folder named by the source's record, shared by the experiments
    # that pin it alike; the variant is the experiment's own.
    fetched = content_key(source["name"], source)
    target = "results/b1/variants/pr48881.json"
    finished = snakemake("-n", target, "--configfile", "config/b1.yaml")
    assert finished.returncode == 0, finished.stderr
    jobs = planned_job_fields(finished.stdout)
    assert [(rule, fields["wildcards"]) for rule, fields in jobs] == [
        ("fetch_source", f"source={fetched}"),
        ("prepare_variant", "experiment=b1, variant=pr48881"),
    ]
    prepare = jobs[1][1]
    assert prepare["input"].split(", ")[0] == (
        f"resources/sources/{fetched}/identity.json"
    )
    assert prepare["output"].split(", ")[0] == target


def test_profiles_parse():
    import yaml

    for profile in (ROOT / "profiles").glob("*/profile.yaml"):
        assert isinstance(yaml.safe_load(profile.read_text()), dict), profile
