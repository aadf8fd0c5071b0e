"""The whole workflow, for real, on the smallest config: every rule runs.

Two arms (original and patched copy, one with a CPU quota and one without) x one
run of a few requests through the embedded engine, then the tables, the report page
and Snakemake's own report. Needs root for the cgroup quota.
"""

import json
import os
import platform
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from study_helpers import leaked_segments, snakemake_command

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "test" / "config.yaml"
EXPERIMENT = "test-embedded"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the arms' CPU quota is a cgroup only root can create"
)


def snakemake(workdir: Path, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        snakemake_command(workdir, *arguments),
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("study")
    finished = snakemake(workdir, "--cores", "1", "all")
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-4000:]
    return workdir


def test_every_run_is_measured_and_valid(finished_study):
    for arm in ("original", "patched"):
        run = finished_study / "results" / EXPERIMENT / arm / "run1"
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["valid"], metrics["invalid_reasons"]
        assert metrics["requests_completed"] == 12
        assert metrics["throughput_rps"] > 0
        lines = (run / "requests.jsonl").read_text().splitlines()
        phases = [json.loads(line)["phase"] for line in lines]
        assert phases.count("warmup") == 4 and phases.count("measured") == 12
        provenance = json.loads((run / "provenance.json").read_text())
        assert provenance["variant"]["name"] == arm
        assert provenance["leaked_segments_removed"] == []


def test_every_run_can_be_traced_to_its_code_config_and_host(finished_study):
    results = finished_study / "results" / EXPERIMENT
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    host = json.loads((results / "host.json").read_text())
    records = {
        arm: json.loads((results / arm / "run1" / "provenance.json").read_text())
        for arm in ("original", "patched")
    }
    for arm, record in records.items():
        assert record["project"]["commit"] == head
        assert record["project"]["dirty"] in (True, False)
        assert record["host"] == host
        assert record["versions"]["python"] == platform.python_version()
        engine = record["versions"]["engine"]
        assert (engine["package"], engine["version"]) == ("sglang", "0.5.23")
        assert (engine["patch"] is None) == (arm == "original")
    hashes = {record["config_sha256"] for record in records.values()}
    assert len(hashes) == 1 and len(hashes.pop()) == 64


def test_every_preparation_runs_before_the_first_arm(finished_study):
    """The arms' priorities interleave the variants only if nothing an arm needs is
    still to be made once the first arm runs: a variant prepared late would let
    the other variant's arms run first."""
    # The study's own log: the first one (later tests run Snakemake again here).
    log = sorted((finished_study / ".snakemake" / "log").glob("*.snakemake.log"))[0]
    started = [
        line.split()[1].rstrip(":")
        for line in log.read_text().splitlines()
        if line.startswith(("rule ", "localrule "))
    ]
    first_arm = started.index("run_arm")
    for rule in ("fetch_source", "prepare_variant", "make_workload", "preflight"):
        assert rule in started
        assert max(i for i, name in enumerate(started) if name == rule) < first_arm
    assert started.count("prepare_variant") == 2


def test_quota_and_threads_are_what_the_arm_asked_for(finished_study):
    results = finished_study / "results" / EXPERIMENT
    limited = json.loads(
        (results / "original" / "run1" / "provenance.json").read_text()
    )
    free = json.loads((results / "patched" / "run1" / "provenance.json").read_text())
    assert limited["quota_in_force"]["cores"] == pytest.approx(1.0)
    assert free["quota_in_force"]["cores"] is None
    monitors = json.loads((results / "patched" / "run1" / "monitors.json").read_text())
    assert monitors["cgroup"]["nr_throttled"] == 0


def test_variants_differ_only_by_the_patch(finished_study):
    variants = finished_study / "results" / "variants"
    original = json.loads((variants / "original.json").read_text())
    patched = json.loads((variants / "patched.json").read_text())
    assert original["source"]["sha256"] == patched["source"]["sha256"]
    assert original["patch"] is None and patched["patch"]["sha256"]
    assert original["mm_utils_sha256"] != patched["mm_utils_sha256"]


def test_tables_and_report_page(finished_study):
    results = finished_study / "results" / EXPERIMENT
    arms = pd.read_csv(results / "tables" / "arms.csv")
    assert set(arms["arm"]) == {"original", "patched"}
    html = (results / "report.html").read_text()
    HTMLParser().feed(html)
    assert "both-serve" in html or "Both copies serve" in html
    assert 'src="http' not in html


def test_nothing_left_to_do_and_snakemake_report_builds(finished_study):
    again = snakemake(finished_study, "-n")
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr
    report = finished_study / "snakemake-report.zip"
    built = snakemake(finished_study, "--report", str(report))
    assert built.returncode == 0, built.stderr[-3000:]
    assert report.stat().st_size > 0


def test_nothing_of_the_runs_is_left_on_the_host(finished_study):
    assert leaked_segments() == []
    for hierarchy in ("cpu", "cpuacct"):
        parent = Path("/sys/fs/cgroup") / hierarchy / "serving-study"
        children = (
            [p for p in parent.iterdir() if p.is_dir()] if parent.exists() else []
        )
        assert not [child for child in children if EXPERIMENT in child.name]
