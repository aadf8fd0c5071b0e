"""SGLang 0.5.23's own server, measured for real by the whole workflow on CPU.

config/test/sglang-cpu.yaml: the seeded tiny Qwen3-VL, the original copy with the
whole server under a quota and the patched copy with the quota on the main process
alone, one run each, through every rule to the report. The server runtime is built
once per pytest cache (conftest.py, a few minutes cold) and lent to each work
directory. Needs root for the cgroups.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from study_helpers import assert_ran_as_planned, leaked_segments, snakemake_command

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "test" / "sglang-cpu.yaml"
EXPERIMENT = "test-sglang-cpu"
ARMS = ("original", "patched-main")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the arms' CPU quota is a cgroup only root can create"
    ),
]


def lend_runtime(workdir: Path, runtime: dict) -> None:
    """The workflow finds the built runtime where rule sglang_runtime puts it."""
    (workdir / "resources").mkdir(parents=True, exist_ok=True)
    built = Path(runtime["python"]).parents[2]  # <runtime>/venv/bin/python
    (workdir / "resources" / "sglang-runtime").symlink_to(built)


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory, sglang_cpu_runtime) -> Path:
    workdir = tmp_path_factory.mktemp("sglang-cpu")
    lend_runtime(workdir, sglang_cpu_runtime)
    (workdir / "started").touch()
    finished = subprocess.run(
        snakemake_command(workdir, "--cores", "2", "all", config=CONFIG),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-4000:]
    return workdir


def run_files(workdir: Path, arm: str) -> dict:
    run = workdir / "results" / EXPERIMENT / arm / "run1"
    return {
        "metrics": json.loads((run / "metrics.json").read_text()),
        "provenance": json.loads((run / "provenance.json").read_text()),
        "server_log": (run / "server.log").read_text(),
    }


def test_every_run_of_the_real_server_is_valid(finished_study):
    for arm in ARMS:
        metrics = run_files(finished_study, arm)["metrics"]
        assert metrics["valid"], metrics["invalid_reasons"]
        assert metrics["requests_completed"] == 6
        assert metrics["throughput_rps"] > 0
        assert metrics["main_cpu_percent"] > 0
        assert metrics["scheduler_cpu_percent"] > 0
    # SGLang's process titles overwrite /proc/<pid>/environ; the arm's own variable
    # is still seen, as the main process reported it.
    checks = run_files(finished_study, "original")["metrics"]["checks"]
    assert checks["environment_seen"] == {"SGLANG_WARMUP_TIMEOUT": "600"}


def test_the_server_is_sglangs_own_with_the_variants_mm_utils(finished_study):
    loaded = {}
    for arm in ARMS:
        files = run_files(finished_study, arm)
        checks, provenance = files["metrics"]["checks"], files["provenance"]
        assert "sglang.launch_server" in provenance["launch"]["argv"]
        assert_ran_as_planned(finished_study, EXPERIMENT, arm)
        assert provenance["server_info"]["version"] == "0.5.23"
        assert checks["transport_seen"] == "cpu"
        # Read from the server's main process, and the one the variant holds.
        assert (
            checks["mm_utils_sha256_loaded"] == provenance["variant"]["mm_utils_sha256"]
        )
        assert checks["mm_utils_loaded_from"].startswith(
            provenance["variant"]["sglang_python_root"]
        )
        assert checks["torch_threads_seen"] >= 1
        assert checks["not_checked"] == []
        loaded[arm] = checks["mm_utils_sha256_loaded"]
    assert loaded["original"] != loaded["patched-main"]


def test_no_stand_in_placeholder_runs_and_the_real_op_only_in_the_scheduler(
    finished_study,
):
    for arm in ARMS:
        checks = run_files(finished_study, arm)["metrics"]["checks"]
        assert checks["stand_in_placeholders_called"] == []
        assert all(
            op.endswith("(sglang::scheduler)") for op in checks["stand_in_ops_called"]
        ), checks["stand_in_ops_called"]


def test_the_quota_binds_the_whole_server_or_the_main_process_alone(finished_study):
    whole = run_files(finished_study, "original")["provenance"]
    main_only = run_files(finished_study, "patched-main")["provenance"]
    assert whole["quota_in_force"]["cores"] == pytest.approx(1.0)
    assert whole["quota_scope"]["model_processes_moved"] == []
    assert main_only["quota_in_force"]["cores"] == pytest.approx(0.5)
    assert main_only["quota_scope"]["scope"] == "main_process"
    assert len(main_only["quota_scope"]["model_processes_moved"]) >= 2
    assert main_only["quota_scope"]["model_group"]["cores"] is None


def test_nothing_of_the_servers_is_left(finished_study):
    assert leaked_segments() == []
    # SGLang's stop leaves its load-report files, and the named semaphores of its
    # killed resource tracker; each run removes its own (files older than the
    # study are another run's), so no run finds a previous one's to reap.
    started = (finished_study / "started").stat().st_mtime
    left = [
        path.name
        for pattern in ("sglang_loads_*.shm", "sem.mp-*")
        for path in Path("/dev/shm").glob(pattern)
        if path.stat().st_mtime >= started
    ]
    assert left == []
    for arm in ARMS:
        provenance = run_files(finished_study, arm)["provenance"]
        assert provenance["leaked_segments_removed"] == []
        assert provenance["leftovers_reaped"]["segments"] == [], arm


def test_each_server_stops_at_once_through_uvicorn_not_the_drain(finished_study):
    # SIGTERM would start the tokenizer manager's drain, polled every 5 s.
    for arm in ARMS:
        server_log = run_files(finished_study, arm)["server_log"]
        assert "SIGTERM received" not in server_log
        assert "Shutting down" in server_log
        assert "Finished server process" in server_log


def test_the_report_names_the_real_server(finished_study):
    results = finished_study / "results" / EXPERIMENT
    report = (results / "report.html").read_text()
    assert "sglang" in report
    arms = (results / "tables" / "arms.csv").read_text()
    assert "patched-main" in arms


def test_a_runs_time_shows_sglangs_own_start_apart_from_the_harness(finished_study):
    for arm in ARMS:
        provenance = run_files(finished_study, arm)["provenance"]
        phases = provenance["phases_s"]
        assert sum(phases.values()) == pytest.approx(provenance["wall_s"], abs=0.05)
        # SGLang's import, model load and warm-up, against what the harness adds
        # around them (leftovers, argv, then the server's facts and its quota).
        around_the_start = phases["before_launch"] + phases["after_healthy"]
        assert phases["server_start"] > around_the_start
