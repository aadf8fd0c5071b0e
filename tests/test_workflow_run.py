"""The whole workflow, for real, on the smallest config: every rule runs.

Two arms (original and patched copy, one with a CPU quota and one without) x one
run of a few requests through the embedded engine, then the tables, the report page
and Snakemake's own report. Needs root for the cgroup quota.
"""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
import yaml
from study_helpers import assert_ran_as_planned, leaked_segments, snakemake_command

from serving_study.config.records import HostSharing
from serving_study.measure.host_sharing import MeasurementLock

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
        lines = (run / "requests.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        phases = [record["phase"] for record in records]
        assert phases.count("warmup") == 4 and phases.count("measured") == 12
        # The rate is the run's own requests: the measured ones over their window,
        # from the first one sent to the last one answered (no warm-up in it).
        window = [record for record in records if record["phase"] == "measured"]
        first_sent = min(record["sent_s"] for record in window)
        last_answered = max(record["end_s"] for record in window)
        assert metrics["throughput_rps"] == pytest.approx(
            12 / (last_answered - first_sent)
        )
        provenance = json.loads((run / "provenance.json").read_text())
        assert provenance["variant"]["name"] == arm
        assert provenance["leaked_segments_removed"] == []
        # Its wall time, phase by phase, from the lock to the files it wrote.
        phases = provenance["phases_s"]
        assert all(value is not None and value >= 0 for value in phases.values())
        assert sum(phases.values()) == pytest.approx(provenance["wall_s"], abs=0.05)
        assert phases["measured_window"] == pytest.approx(
            metrics["measured_seconds"], abs=0.01
        )


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
    preparation = ("fetch_source", "prepare_variant", "make_workload", "preflight")
    for rule in (*preparation, "arm_preflight", "launch_plan"):
        assert rule in started[:first_arm]
    # Once the first arm runs, only runs and what reads them: a preparation job
    # left among the runs would have the arms run one after the other.
    assert set(started[first_arm:]) <= {"run_arm", "aggregate", "report_html", "all"}
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


def test_every_run_started_its_arms_launch_plan_as_it_is(finished_study):
    for arm in ("original", "patched"):
        plan = assert_ran_as_planned(finished_study, EXPERIMENT, arm)
        assert plan["engine"] == "embedded" and plan["container"] is None
        assert "--sglang-source" in plan["argv"]
    limited = assert_ran_as_planned(finished_study, EXPERIMENT, "original")
    assert limited["quota"] == {"cores": 1.0, "scope": "server", "timing": "healthy"}


def test_variants_differ_only_by_the_patch(finished_study):
    variants = finished_study / "results" / EXPERIMENT / "variants"
    original = json.loads((variants / "original.json").read_text())
    patched = json.loads((variants / "patched.json").read_text())
    assert original["source"]["sha256"] == patched["source"]["sha256"]
    assert original["patch"] is None and patched["patch"]["sha256"]
    assert original["mm_utils_sha256"] != patched["mm_utils_sha256"]


class VerdictItems(HTMLParser):
    """The report page's verdicts: (class, text) of each item of its verdict list."""

    def __init__(self):
        super().__init__()
        self.items: list[tuple[str, str]] = []
        self.in_list = self.in_item = False

    def handle_starttag(self, tag, attrs):
        if tag == "ul" and ("class", "verdicts") in attrs:
            self.in_list = True
        elif tag == "li" and self.in_list:
            self.in_item = True
            self.items.append((dict(attrs).get("class", ""), ""))

    def handle_endtag(self, tag):
        if tag == "ul":
            self.in_list = False
        elif tag == "li":
            self.in_item = False

    def handle_data(self, data):
        if self.in_item:
            css, text = self.items[-1]
            self.items[-1] = (css, text + data)


def test_the_report_page_states_each_claims_verdict_from_the_tables(finished_study):
    results = finished_study / "results" / EXPERIMENT
    arms = pd.read_csv(results / "tables" / "arms.csv")
    assert set(arms["arm"]) == {"original", "patched"}
    (claim,) = pd.read_csv(results / "tables" / "claims.csv").to_dict("records")
    # The test config's one claim: both arms' throughput medians within 90%.
    (stated,) = yaml.safe_load(CONFIG.read_text())["claims"]
    throughput = arms[arms["metric"] == "throughput_rps"].set_index("arm")["median"]
    spread = throughput.max() / throughput.min() - 1
    assert (claim["claim"], claim["value"]) == (stated["name"], pytest.approx(spread))
    holds = spread <= stated["tolerance"]
    assert claim["verdict"] == ("holds" if holds else "does not hold")
    html = (results / "report.html").read_text()
    page = VerdictItems()
    page.feed(html)
    css = "holds" if holds else "does-not-hold"
    assert page.items == [(css, f"{claim['sentence']}.")]
    assert 'src="http' not in html


def test_the_report_draws_each_arms_run_over_time(finished_study):
    """Each arm's one valid run over its measured window: its 12 requests' TTFT,
    and main-process CPU and throttled share where the arm has a quota."""
    results = finished_study / "results" / EXPERIMENT
    html = (results / "report.html").read_text()
    found = re.search(r'data-chart="chart-run_timelines">(.*?)</script>', html, re.S)
    spec = json.loads(found[1])
    assert (results / "figures" / "run_timelines.html").is_file()
    runs = pd.read_csv(results / "tables" / "runs.csv").set_index("arm")
    cells = [cell for row in spec["vconcat"] for cell in row["hconcat"]]
    drawn = {cell["title"]: cell["vconcat"] for cell in cells if "title" in cell}
    assert list(drawn) == [
        f"{arm} ({arm}): run 1: {runs.loc[arm, 'throughput_rps']:.3g} req/s, "
        "the median of 1 valid run"
        for arm in ("original", "patched")
    ]
    for arm, panels in zip(("original", "patched"), drawn.values(), strict=True):
        ttft, cpu, throttled = (spec["datasets"][p["data"]["name"]] for p in panels)
        assert len(ttft) == 12 and all(point["value"] > 0 for point in ttft)
        assert cpu and all(point["value"] >= 0 for point in cpu)
        if arm == "patched":  # no quota
            assert throttled == [{"text": "throttled share: no CPU quota"}]
        else:
            assert throttled and all(0 <= p["value"] <= 1 for p in throttled)


def test_nothing_left_to_do_and_snakemake_report_builds(finished_study):
    again = snakemake(finished_study, "-n")
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr
    report = finished_study / "snakemake-report.zip"
    built = snakemake(finished_study, "--report", str(report))
    assert built.returncode == 0, built.stderr[-3000:]
    # It carries the study's page, figures and tables as the workflow wrote them.
    results = finished_study / "results" / EXPERIMENT
    items = [results / "report.html", *(results / "figures").glob("*.html")]
    with zipfile.ZipFile(report) as archive:
        assert archive.testzip() is None
        carried = {
            Path(name).name: archive.read(name)
            for name in archive.namelist()
            if "/data/raw/" in name
        }
        assert "snakemake-report/report.html" in archive.namelist()
    assert carried == {item.name: item.read_bytes() for item in items}


def test_nothing_of_the_runs_is_left_on_the_host(finished_study):
    assert leaked_segments() == []
    for hierarchy in ("cpu", "cpuacct"):
        parent = Path("/sys/fs/cgroup") / hierarchy / "serving-study"
        children = (
            [p for p in parent.iterdir() if p.is_dir()] if parent.exists() else []
        )
        assert not [child for child in children if EXPERIMENT in child.name]


def test_a_forced_re_measure_on_a_busy_host_keeps_the_run_byte_for_byte(
    finished_study, tmp_path
):
    """``--forcerun`` makes Snakemake delete the run's outputs; the new attempt
    finds the host held by another pipeline (lock: fail), measures nothing, and
    the run's earlier files are its outputs again, unchanged."""
    study = tmp_path / "study"
    shutil.copytree(finished_study, study, symlinks=True)
    run = study / "results" / EXPERIMENT / "original" / "run1"
    before = {path.name: path.read_bytes() for path in run.iterdir()}
    busy = tmp_path / "busy.yaml"
    lock_file = tmp_path / "measurement.lock"
    busy.write_text(
        yaml.safe_dump({"host_sharing": {"lock": "fail", "lock_file": str(lock_file)}})
    )
    sharing = HostSharing.from_config({"lock_file": str(lock_file)})
    with MeasurementLock.acquire(sharing, "another pipeline's run"):
        forced = subprocess.run(
            snakemake_command(
                study,
                "--forcerun",
                "run_arm",
                "--cores",
                "1",
                str(run.relative_to(study) / "metrics.json"),
                config=(CONFIG, busy),
            ),
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert forced.returncode == 0, forced.stdout[-3000:] + forced.stderr[-3000:]
    assert {path.name: path.read_bytes() for path in run.iterdir()} == before
    log = study / "results/logs/run_arm" / EXPERIMENT / "original/run1.log"
    assert "the run keeps its earlier attempt" in log.read_text()


def busy_until(done, hogs: int = 3) -> None:
    """Keep ``hogs`` processes spinning on the host until ``done()`` is true."""
    spin = [sys.executable, "-c", "while True: pass"]
    spinning = [subprocess.Popen(spin) for _ in range(hogs)]
    try:
        deadline = time.monotonic() + 600
        while not done() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for hog in spinning:
            hog.kill()
            hog.wait()


def test_a_run_spoiled_by_other_load_is_tried_again_once_the_host_is_quiet(
    finished_study, tmp_path
):
    """Other processes spin through a re-measure's first attempt: it is invalid
    for the host's load, the job waits for a quiet host and tries again, and the
    run, its table row and the report say it took two attempts and why."""
    study = tmp_path / "study"
    shutil.copytree(finished_study, study, symlinks=True)
    results = study / "results" / EXPERIMENT
    attempts = results / "attempts" / "original" / "run1"
    kept_before = len([p for p in attempts.iterdir() if p.is_dir()])
    strict = tmp_path / "strict.yaml"
    strict.write_text(
        yaml.safe_dump(
            {
                "host_sharing": {
                    "max_other_load_cores": 0.75,
                    "retries": 4,
                    "quiet_for_s": 2,
                    "quiet_wait_s": 300,
                },
            }
        )
    )
    forced = subprocess.Popen(
        snakemake_command(
            study,
            "--forcerun",
            str((results / "original" / "run1" / "metrics.json").relative_to(study)),
            "--cores",
            "1",
            "all",
            config=(CONFIG, strict),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def first_attempt_kept() -> bool:
        kept = [p for p in attempts.iterdir() if p.is_dir() and p.suffix != ".partial"]
        return len(kept) > kept_before or forced.poll() is not None

    busy_until(first_attempt_kept)
    output, _ = forced.communicate(timeout=900)
    assert forced.returncode == 0, output[-4000:]
    listing = json.loads((results / "original/run1/attempts.json").read_text())
    this_job = [entry for entry in listing if entry["job"] == listing[-1]["job"]]
    # At least the first attempt is spoiled; a loaded host may spoil another.
    *spoiled, current = this_job
    assert spoiled and current["outcome"] == "current" and current["valid"]
    assert {entry["outcome"] for entry in spoiled} == {"failed outside the arm"}
    assert "other work on the host used" in spoiled[0]["invalid_reasons"][0]
    assert current["waited_for_quiet_s"] >= 2
    runs = pd.read_csv(results / "tables" / "runs.csv").set_index("arm")
    assert runs.loc["original", "attempts"] == len(this_job)
    assert runs.loc["patched", "attempts"] == 1
    assert "other work on the host" in runs.loc["original", "retried_because"]
    assert runs.loc["original", "valid"]
    assert "retried because" in (results / "report.html").read_text()


@pytest.mark.slow
def test_our_client_and_bench_serving_run_one_arm_side_by_side(
    finished_study, tmp_path, sglang_cpu_runtime
):
    """The client cross-check (config client_crosscheck), one pair on arm
    original: our client's run and SGLang 0.5.23's own bench_serving, each on a
    fresh server of the arm, both valid; the table, bench_serving's own result
    and the report show them, and the study's runs are not measured again."""
    study = tmp_path / "study"
    shutil.copytree(finished_study, study, symlinks=True)
    # The real server's CPU runtime, where rule sglang_runtime puts it.
    built = Path(sglang_cpu_runtime["python"]).parents[2]
    (study / "resources").mkdir(exist_ok=True)
    (study / "resources" / "sglang-runtime").symlink_to(built)
    results = study / "results" / EXPERIMENT
    run = results / "original" / "run1" / "metrics.json"
    measured_before = run.read_bytes()
    overlay = tmp_path / "crosscheck.yaml"
    overlay.write_text(
        yaml.safe_dump({"client_crosscheck": {"arm": "original", "pairs": 1}})
    )
    finished = subprocess.run(
        snakemake_command(study, "--cores", "1", "all", config=(CONFIG, overlay)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    runs = pd.read_csv(results / "tables" / "client_crosscheck_runs.csv")
    assert list(runs["client"]) == ["ours", "bench_serving"]
    assert runs["valid"].all(), list(runs["invalid_reasons"])
    assert list(runs["requests_completed"]) == [12, 12]
    pair = results / "crosscheck" / "original" / "pair1"
    theirs = json.loads((pair / "bench_serving" / "bench_serving.json").read_text())
    assert theirs["backend"] == "sglang-oai-chat" and theirs["max_concurrency"] == 4
    assert theirs["completed"] == 12 and theirs["total_output_tokens"] == 12 * 8
    summary = pd.read_csv(results / "tables" / "client_crosscheck.csv").iloc[0]
    assert summary["valid_pairs"] == 1 and summary["ratio"] > 0
    assert summary["verdict"].endswith("within 5%")
    assert (
        "Our client against SGLang&#39;s bench_serving"
        in (results / "report.html").read_text()
    )
    assert run.read_bytes() == measured_before
