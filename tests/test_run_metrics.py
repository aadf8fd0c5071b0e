"""A run's figures and validity, from the hand-computed fixture in
tests/fixtures/report (its README works every number out)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from serving_study.config.records import Arm
from serving_study.measure.request_log import read_request_log
from serving_study.measure.run_metrics import (
    failed_run_metrics,
    request_figures,
    run_number_from_directory,
    summarize_run,
)
from serving_study.metric_catalogue import METRICS

FIXTURE = Path(__file__).parent / "fixtures" / "report"


def fixture_arm(name: str, **changes) -> Arm:
    """The fixture config's arm ``name``, with ``changes`` to its config keys."""
    config = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    section = next(arm for arm in config["arms"] if arm["name"] == name)
    return Arm.from_config({**section, **changes})


def fixture_checks(arm: str, run: int) -> dict:
    return json.loads(
        (FIXTURE / "runs" / arm / f"run{run}" / "checks.json").read_text()
    )


def summarize_fixture(arm: str, run: int, **overrides) -> dict:
    directory = FIXTURE / "runs" / arm / f"run{run}"
    checks = {**fixture_checks(arm, run), **overrides}
    return summarize_run(
        directory / "requests.jsonl",
        directory / "monitors.json",
        fixture_arm(arm),
        checks,
    )


def copy_run(tmp_path: Path, arm: str, run: int) -> Path:
    directory = tmp_path / arm / f"run{run}"
    shutil.copytree(FIXTURE / "runs" / arm / f"run{run}", directory)
    return directory


def summarize_with_monitors(tmp_path: Path, **monitor_changes) -> dict:
    """Run 1 of arm ``original``, summarized from a copy whose monitors.json has
    ``monitor_changes`` on top of the fixture's."""
    directory = copy_run(tmp_path, "original", 1)
    monitors = json.loads((directory / "monitors.json").read_text())
    (directory / "monitors.json").write_text(json.dumps(monitors | monitor_changes))
    return summarize_run(
        directory / "requests.jsonl",
        directory / "monitors.json",
        fixture_arm("original"),
        fixture_checks("original", 1),
    )


def test_valid_run_has_the_hand_computed_figures():
    metrics = summarize_fixture("original", 1)

    assert metrics["valid"] is True
    assert metrics["invalid_reasons"] == []
    assert metrics["arm"] == "original"
    assert metrics["run"] == 1
    assert metrics["requests_measured"] == 4
    assert metrics["requests_completed"] == 4
    assert metrics["requests_warmup"] == 1
    assert metrics["error_count"] == 0
    assert metrics["measured_seconds"] == pytest.approx(2.0)
    assert metrics["throughput_rps"] == pytest.approx(2.0)
    assert metrics["output_tokens_per_s"] == pytest.approx(16.0)
    assert metrics["ttft_p50_ms"] == pytest.approx(250.0)
    assert metrics["ttft_p90_ms"] == pytest.approx(370.0)
    assert metrics["ttft_p99_ms"] == pytest.approx(397.0)
    assert metrics["e2e_p50_ms"] == pytest.approx(1250.0)
    assert metrics["dispatch_lag_p99_ms"] == pytest.approx(3.97)
    assert metrics["dispatch_lag_max_ms"] == pytest.approx(4.0)
    assert metrics["main_cpu_percent"] == 150.0
    assert metrics["scheduler_cpu_percent"] == 80.0
    assert metrics["cores_used"] == pytest.approx(1.9)
    assert metrics["throttled_share"] == pytest.approx(0.8)
    assert metrics["torch_threads"] == 2
    # 4 requests in 2 s with the main process at 1.5 cores: 750 ms each.
    assert metrics["main_cpu_ms_per_request"] == pytest.approx(750.0)
    assert metrics["scheduler_cpu_ms_per_request"] == pytest.approx(400.0)
    assert metrics["cgroup_cpu_ms_per_request"] == pytest.approx(950.0)
    assert metrics["gpu_util_percent"] is None
    assert metrics["window_start_epoch"] == 1767261600
    assert set(METRICS) <= set(metrics)
    json.dumps(metrics)  # metrics.json must be writable as is


def test_the_hosts_other_load_and_steal_become_run_figures(tmp_path):
    metrics = summarize_with_monitors(
        tmp_path,
        host_load={
            "wall_seconds": 2.0,
            "host_busy_cores": 1.2,
            "own_cores": 1.1,
            "other_cores": 0.1,
            "steal_cores": 0.6,
        },
    )
    assert metrics["host_other_cores"] == pytest.approx(0.1)
    assert metrics["host_steal_cores"] == pytest.approx(0.6)
    # Reported, not judged: a hypervisor's steal does not make the run invalid.
    assert metrics["valid"] is True
    assert summarize_fixture("original", 1)["host_steal_cores"] is None


def streamed(ttft_ms: float, e2e_ms: float, itl_ms: list[float]) -> dict:
    """A completed measured request whose stream had len(itl_ms) + 1 token chunks."""
    return {
        "phase": "measured",
        "status": 200,
        "error": None,
        "sent_s": 0.0,
        "end_s": e2e_ms / 1000,
        "ttft_ms": ttft_ms,
        "e2e_ms": e2e_ms,
        "output_tokens": len(itl_ms) + 1,
        "itl_ms": itl_ms,
    }


def test_tpot_and_itl_are_bench_servings():
    """TPOT: (e2e - TTFT) / (output tokens - 1) per request with more than one
    token; ITL: every gap between token chunks of every request."""
    figures = request_figures(
        [
            streamed(100, 400, [50, 100, 150]),  # TPOT 100 ms
            streamed(200, 500, [300]),  # TPOT 300 ms
            streamed(50, 60, []),  # one token: no TPOT, no gap
        ]
    )
    assert figures["tpot_p50_ms"] == pytest.approx(200)
    assert figures["tpot_p90_ms"] == pytest.approx(280)
    assert figures["tpot_p99_ms"] == pytest.approx(298)
    assert figures["itl_p50_ms"] == pytest.approx(125)
    assert figures["itl_p99_ms"] == pytest.approx(295.5)


def test_a_log_without_chunk_times_has_tpot_but_no_itl():
    figures = request_figures([streamed(100, 400, [50, 100, 150]) | {"itl_ms": None}])
    assert figures["tpot_p50_ms"] == pytest.approx(100)
    assert figures["itl_p50_ms"] is None


def test_warmup_request_stays_out_of_the_window():
    # The warm-up request is sent at 0 s; counting it would give 5 / 3 s.
    metrics = summarize_fixture("original", 2)
    assert metrics["throughput_rps"] == pytest.approx(4 / 4.0)
    assert metrics["ttft_p50_ms"] == pytest.approx(400.0)


def test_failed_request_and_late_dispatch_make_the_run_invalid():
    metrics = summarize_fixture("patched", 3)

    assert metrics["valid"] is False
    assert metrics["error_count"] == 1
    assert metrics["requests_completed"] == 3
    assert metrics["throughput_rps"] == pytest.approx(6.0)
    assert metrics["invalid_reasons"] == [
        "1 of 4 measured requests did not complete (first: request 4: "
        "HTTP 500: engine overloaded <script>alert(1)</script>)",
        "dispatch lag reached 80.0 ms, above the allowed 50 ms: "
        "the client fell behind its schedule",
    ]


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (
            {"quota_in_force_cores": 4.0},
            "CPU quota in force was 4 cores, the arm asks for 2 cores",
        ),
        (
            {"quota_in_force_cores": None},
            "CPU quota in force was none, the arm asks for 2 cores",
        ),
        (
            {"quota_expected_cores": 13.6},
            "the runner expected a quota of 13.6 cores, the arm asks for 2 cores",
        ),
        (
            {"environment_seen": {"OMP_NUM_THREADS": "8"}},
            "OMP_NUM_THREADS was '8' in the server, the arm asks for unset",
        ),
        ({"server_restarted": True}, "the server restarted during the run"),
        (
            {"warmup_requests": 16},
            "warm-up requests in the log: 1, expected 16; "
            "warm-up was not excluded as planned",
        ),
        (
            {"transport_expected": "cpu", "transport_seen": "cuda_ipc"},
            "the server resolved transport 'cuda_ipc', the arm asks 'cpu'",
        ),
        (
            {"mm_utils_sha256_expected": "a" * 64, "mm_utils_sha256_loaded": "b" * 64},
            "the server's main process loaded an mm_utils.py with sha256 "
            "bbbbbbbbbbbb..., the variant's is aaaaaaaaaaaa...",
        ),
        (
            {"inline_fallback_reported": True},
            "SGLang sent images inline because /dev/shm was full, so the "
            "shared-memory copy under study was skipped; give the server more /dev/shm",
        ),
        (
            {"patched_modules_never_loaded": ["sglang.srt.utils.unused"]},
            "the variant's change is to sglang/srt/utils/unused.py, which no "
            "server process loaded: the patch does not touch the code under study",
        ),
        (
            {"gc_never_resumed_pids": [101, 102]},
            "the garbage collector paused for the server's start-up never came back "
            "on in pid 101, 102: SGLang's post-warm-up gc freeze did not run there "
            "(is --skip-server-warmup set?)",
        ),
        (
            {"stand_in_placeholders_called": ["fused_sigmoid_mul_cpu"]},
            "the sgl-kernel stand-in's placeholders ran: fused_sigmoid_mul_cpu",
        ),
        (
            {"max_dispatch_lag_ms_allowed": 3.5},
            "dispatch lag reached 4.0 ms, above the allowed 3.5 ms: "
            "the client fell behind its schedule",
        ),
    ],
)
def test_each_failed_check_is_a_reason(overrides, reason):
    metrics = summarize_fixture("original", 1, **overrides)
    assert metrics["valid"] is False
    assert metrics["invalid_reasons"] == [reason]


def test_thread_cap_must_be_seen_in_environment_and_in_torch():
    arm = fixture_arm("original", environment={"OMP_NUM_THREADS": "8"})
    directory = FIXTURE / "runs" / "original" / "run1"
    checks = fixture_checks("original", 1)

    capped = {**checks, "environment_seen": {"OMP_NUM_THREADS": "8"}}
    capped["torch_threads_seen"] = 8
    metrics = summarize_run(
        directory / "requests.jsonl", directory / "monitors.json", arm, capped
    )
    assert metrics["valid"] is True
    assert metrics["environment"] == {"OMP_NUM_THREADS": "8"}

    uncapped = {**checks, "torch_threads_seen": 2}
    metrics = summarize_run(
        directory / "requests.jsonl", directory / "monitors.json", arm, uncapped
    )
    assert metrics["invalid_reasons"] == [
        "OMP_NUM_THREADS was unset in the server, the arm asks for '8'",
        "torch used 2 intra-op threads, OMP_NUM_THREADS=8 asks for 8",
    ]


def test_measured_count_must_match_the_arm():
    arm = fixture_arm("original", requests=5)
    directory = FIXTURE / "runs" / "original" / "run1"
    metrics = summarize_run(
        directory / "requests.jsonl",
        directory / "monitors.json",
        arm,
        fixture_checks("original", 1),
    )
    assert metrics["invalid_reasons"] == [
        "the log holds 4 measured requests, the arm asks for 5"
    ]


def test_changed_server_pids_make_the_run_invalid(tmp_path):
    metrics = summarize_with_monitors(tmp_path, server_pids_changed=True)
    assert metrics["run"] == 1  # read from the run1 directory name
    assert metrics["invalid_reasons"] == [
        "the server's process ids changed during the measured window"
    ]


def test_throttling_without_a_quota_makes_the_run_invalid():
    arm = fixture_arm("original", cpu_quota="none")
    directory = FIXTURE / "runs" / "original" / "run1"
    checks = {
        **fixture_checks("original", 1),
        "quota_expected_cores": None,
        "quota_in_force_cores": None,
    }
    metrics = summarize_run(
        directory / "requests.jsonl", directory / "monitors.json", arm, checks
    )
    assert metrics["cpu_quota"] == "none"
    assert metrics["invalid_reasons"] == [
        "the cgroup was throttled in 80 periods although the arm has no CPU "
        "quota: another limit applied"
    ]


def test_missing_monitor_summary_is_a_reason_and_leaves_figures_null(tmp_path):
    directory = copy_run(tmp_path, "original", 1)
    (directory / "monitors.json").unlink()

    metrics = summarize_run(
        directory / "requests.jsonl",
        directory / "monitors.json",
        fixture_arm("original"),
        fixture_checks("original", 1),
    )
    assert metrics["valid"] is False
    assert metrics["invalid_reasons"] == [
        f"monitor summary {directory / 'monitors.json'} is missing"
    ]
    assert metrics["main_cpu_percent"] is None
    assert metrics["main_cpu_ms_per_request"] is None
    assert metrics["throughput_rps"] == pytest.approx(2.0)


def test_failed_run_has_null_figures_and_the_reason():
    metrics = failed_run_metrics(
        fixture_arm("patched"), 2, "server never became healthy"
    )

    assert metrics["arm"] == "patched"
    assert metrics["run"] == 2
    assert metrics["valid"] is False
    assert metrics["invalid_reasons"] == ["server never became healthy"]
    assert all(metrics[name] is None for name in METRICS)
    json.dumps(metrics)


def test_run_number_comes_from_the_directory_name():
    assert run_number_from_directory(Path("results/b1/A/run12")) == 12
    assert run_number_from_directory(Path("results/b1/A/latest")) is None


def test_broken_log_line_names_file_and_line(tmp_path):
    log = tmp_path / "requests.jsonl"
    log.write_text('{"index": 0}\nnot json\n')
    with pytest.raises(ValueError, match=r"requests.jsonl:2 is not a JSON object"):
        read_request_log(log)
