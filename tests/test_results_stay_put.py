"""What was measured stays measured: an edit re-measures only what it changed, and a
second experiment in the same checkout touches nothing of the first.

Each test works on the plan (``snakemake -n``) of the tiny test study whose every
output exists and whose jobs Snakemake has recorded (touched, not run): seconds, and
the same decisions Snakemake takes before a real study.
"""

import shutil
from pathlib import Path

import pytest
import yaml
from study_helpers import TEST_CONFIG, planned_jobs, touch_study

RUN_RULES = {"run_arm", "map_block", "bisect_commits", "measure_harness"}


def runs(jobs: set[tuple[str, str]]) -> set[str]:
    """The measuring jobs of a plan, by their wildcards."""
    return {wildcards for rule, wildcards in jobs if rule in RUN_RULES}


def edited_config(tmp_path: Path, edit, name: str = "edited.yaml") -> Path:
    config = yaml.safe_load(TEST_CONFIG.read_text())
    edit(config)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture
def measured_study(tmp_path_factory, tmp_path) -> Path:
    """The test study as if measured, copied fresh for each test (it may change it)."""
    template = tmp_path_factory.getbasetemp() / "measured-test-study"
    if not template.exists():
        touch_study(template, TEST_CONFIG)
    workdir = tmp_path / "study"
    shutil.copytree(template, workdir, symlinks=True)
    return workdir


def test_a_measured_study_plans_nothing(measured_study):
    assert planned_jobs(measured_study, TEST_CONFIG) == set()


def test_keys_reordered_in_the_yaml_plan_nothing(measured_study, tmp_path):
    config = yaml.safe_load(TEST_CONFIG.read_text())
    reordered = tmp_path / "reordered.yaml"
    reordered.write_text(yaml.safe_dump(reversed_mappings(config), sort_keys=False))
    assert planned_jobs(measured_study, reordered) == set()


def reversed_mappings(value):
    if isinstance(value, dict):
        return {key: reversed_mappings(value[key]) for key in reversed(value)}
    if isinstance(value, list):
        return [reversed_mappings(item) for item in value]
    return value


def test_a_second_experiment_reusing_names_leaves_the_first_alone(
    measured_study, tmp_path
):
    def other_settings(config):
        config["experiment"] = "test-other"
        config["sources"][0]["pypi"]["version"] = "0.5.22"
        config["variants"][0]["patch"] = config["variants"][1]["patch"]
        config["workloads"][0]["input_tokens"] = 64
        config["workloads"][0]["width"] = 128

    other = edited_config(tmp_path, other_settings, "other.yaml")
    # The second study runs in the same checkout; what it shares with the first
    # (nothing here, every record differs) it finds made.
    touch_study(
        measured_study,
        other,
        "fetch_source",
        "prepare_variant",
        "make_workload",
        "preflight",
        "run_arm",
        "aggregate",
        "report_html",
    )
    assert (measured_study / "results/test-other/workloads/tiny/manifest.json").exists()
    assert planned_jobs(measured_study, TEST_CONFIG) == set()


def test_an_added_arm_plans_its_runs_alone(measured_study, tmp_path):
    def add_arm(config):
        config["arms"].append({**config["arms"][0], "name": "original-again"})

    jobs = planned_jobs(measured_study, edited_config(tmp_path, add_arm))
    assert runs(jobs) == {"experiment=test-embedded, arm=original-again, run=1"}
    assert ("arm_preflight", "experiment=test-embedded, arm=original-again") in jobs
    assert ("launch_plan", "experiment=test-embedded, arm=original-again") in jobs
    assert {rule for rule, _ in jobs} == {
        "arm_preflight",
        "launch_plan",
        "run_arm",
        "aggregate",
        "report_html",
        "all",
    }


def test_an_arm_changed_plans_only_its_own_runs(measured_study, tmp_path):
    def change_patched(config):
        config["arms"][1]["concurrency"] = 2

    jobs = planned_jobs(measured_study, edited_config(tmp_path, change_patched))
    assert runs(jobs) == {"experiment=test-embedded, arm=patched, run=1"}
    assert ("preflight", "experiment=test-embedded") not in jobs
    plans = {wildcards for rule, wildcards in jobs if rule == "launch_plan"}
    assert plans == {"experiment=test-embedded, arm=patched"}


def test_a_workload_changed_plans_the_runs_that_replay_it(measured_study, tmp_path):
    def change_workload(config):
        config["workloads"][0]["images"] = 6

    jobs = planned_jobs(measured_study, edited_config(tmp_path, change_workload))
    assert runs(jobs) == {
        "experiment=test-embedded, arm=original, run=1",
        "experiment=test-embedded, arm=patched, run=1",
    }


def edit_description(config):
    config["arms"][0]["description"] = "the original copy, described anew"
    config["variants"][0]["description"] = "the release as published"
    config["description"] = "a new description of the study"


def edit_claim_bound(config):
    config["claims"][0]["tolerance"] = 0.5


def edit_where_a_bound_came_from(config):
    config["claims"][0]["bound_from"] = {
        "kind": "redesign",
        "what": "the workload's images made larger",
        "result": "1.01x, does not hold",
        "committed": False,
    }


def edit_host_sharing(config):
    config["host_sharing"] = {
        "max_other_load_cores": 2,
        "max_steal_cores": 1,
        "retries": 5,
        "quiet_for_s": 30,
        "lock": "fail",
        "lock_file": "/run/lock/another-study.lock",
    }


@pytest.mark.parametrize(
    "edit",
    [
        edit_description,
        edit_claim_bound,
        edit_where_a_bound_came_from,
        edit_host_sharing,
    ],
    ids=["descriptions", "a claim's bound", "where a bound came from", "host sharing"],
)
def test_an_edit_that_changes_no_run_plans_no_run(measured_study, tmp_path, edit):
    jobs = planned_jobs(measured_study, edited_config(tmp_path, edit))
    assert {rule for rule, _ in jobs} <= {"aggregate", "report_html", "all"}


def test_a_results_page_added_plans_no_run(tmp_path):
    # A new page brings a new docs/results/*/tables/fixes.csv to quote.
    workdir = tmp_path / "study"
    first = workdir / "docs/results/some-study/tables/fixes.csv"
    first.parent.mkdir(parents=True)
    first.write_text("arm,fix\n")
    touch_study(workdir, TEST_CONFIG)
    added = workdir / "docs/results/another-study/tables/fixes.csv"
    added.parent.mkdir(parents=True)
    added.write_text("arm,fix\nB,threads\n")
    assert planned_jobs(workdir, TEST_CONFIG) == set()


def test_a_published_results_file_changed_plans_no_run(tmp_path):
    # The preflight's prescription quotes docs/results/*/tables/fixes.csv.
    workdir = tmp_path / "study"
    published = workdir / "docs/results/some-study/tables/fixes.csv"
    published.parent.mkdir(parents=True)
    published.write_text("arm,fix\n")
    touch_study(workdir, TEST_CONFIG)
    published.write_text("arm,fix\nB,threads\n")
    assert planned_jobs(workdir, TEST_CONFIG) == set()
