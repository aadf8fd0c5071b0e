"""The harness benchmarks measure what they say, with tiny sizes and durations.

Every section runs for real: the zero-work server over HTTP, the load client and a
raw socket client against it, the monitors against a process tree in a cgroup, each
variant's own ShmPointerMMData in a fresh process, one real embedded arm (slow).
No speed is asserted: speeds are the benchmark target's figures, not tests.
"""

import hashlib
import json
import os
import socket
import statistics
import time
from pathlib import Path

import psutil
import pytest
from study_helpers import embedded_arm, embedded_run_settings

from serving_study.config.records import HostSharing, Variant
from serving_study.measure.chat_requests import load_requests
from serving_study.measure.request_log import read_request_log
from serving_study.servers.cgroups import project_group_directories
from serving_study.sources.variants import prepare_variant
from serving_study.studies.harness import client_roofline, monitor_cost
from serving_study.studies.harness.arm_overhead import measure_arm_overhead
from serving_study.studies.harness.benchmark_host import (
    CpuReading,
    client_and_server_cpus,
    host_load_between,
)
from serving_study.studies.harness.benchmark_run import goals_met
from serving_study.studies.harness.client_roofline import (
    measure_client_rate,
    measure_ttft_overhead,
    raw_socket_ttfts,
)
from serving_study.studies.harness.dispatch_lag import check_dispatch_lag_invalidation
from serving_study.studies.harness.monitor_cost import measure_monitor_cpu
from serving_study.studies.harness.shm_copy import measure_shm_copy, summarize_shm_copy
from serving_study.studies.harness.study_wall_time import (
    default_study_wall,
    with_current_arm_overhead,
)
from serving_study.studies.harness.zero_work import zero_work_server
from serving_study.workloads import generate_workload

REPOSITORY = Path(__file__).resolve().parents[1]
REQUEST_TIMEOUT_S = 60
PATCH = "envs/patches/pr48881-shm-copy-without-thread-fanout.patch"
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the CPU-quota cgroups only root can create"
)


@pytest.fixture(scope="module")
def chat_requests(tmp_path_factory):
    out = tmp_path_factory.mktemp("workload") / "tiny"
    spec = {"name": "tiny", "seed": 1, "images": 4, "width": 64, "height": 64}
    generate_workload(spec | {"input_tokens": 8, "format": "jpeg"}, out)
    return load_requests(out / "manifest.json")


@pytest.fixture(scope="module")
def server():
    with zero_work_server(cpu=None) as running:
        yield running


@pytest.fixture(scope="module")
def variants(sglang_0_5_23, tmp_path_factory) -> dict[str, dict]:
    tree, source = sglang_0_5_23
    directory = tmp_path_factory.mktemp("variants")
    original = {"name": "original", "source": "sglang-0.5.23"}
    patched = {"name": "patched", "source": "sglang-0.5.23", "patch": PATCH}
    return {
        "original": prepare_variant(original, tree, source, None, directory / "o"),
        "patched": prepare_variant(
            patched, tree, source, REPOSITORY / PATCH, directory / "p"
        ),
    }


def own_children() -> set[int]:
    """Live descendants of this process (the module's zero-work server among them)."""
    return {
        child.pid
        for child in psutil.Process().children(recursive=True)
        if child.status() != psutil.STATUS_ZOMBIE
    }


# --- Client ---------------------------------------------------------------------


def test_the_zero_work_server_answers_with_every_token_at_once(
    chat_requests, server, tmp_path
):
    figures = measure_client_rate(
        chat_requests,
        server,
        client_cpu=client_and_server_cpus()[0],
        concurrencies=[1, 4],
        measured_requests=12,
        study_peak_rps=25.7,
        request_timeout_s=REQUEST_TIMEOUT_S,
        out_dir=tmp_path,
    )

    rates = []
    for level in figures["levels"]:
        assert level["completed"] == 12 and level["errors"] == 0
        log = (tmp_path / f"client-rate-c{level['concurrency']}.jsonl").read_text()
        records = [json.loads(line) for line in log.splitlines()]
        assert {record["output_tokens"] for record in records} == {32}
        assert {record["status"] for record in records} == {200}
        # A level's rate is its 12 measured requests over their own window, from
        # the first one sent to the last one answered: its warm-up is left out.
        measured = [record for record in records if record["phase"] == "measured"]
        first_sent = min(record["sent_s"] for record in measured)
        last_answered = max(record["end_s"] for record in measured)
        rates.append(12 / (last_answered - first_sent))
        assert level["rps"] == pytest.approx(rates[-1], abs=0.051)  # to 0.1 req/s
    assert figures["client_max_rps"] == pytest.approx(max(rates), abs=0.051)
    assert figures["client_headroom_ratio"] == pytest.approx(
        max(rates) / 25.7, abs=0.06
    )


def test_the_raw_socket_client_reads_whole_answers_on_one_connection(
    chat_requests, server, monkeypatch
):
    bodies = [
        request.body(model="zero-work", output_tokens=32) for request in chat_requests
    ]
    connect, connections = socket.create_connection, []

    def counted_connection(*arguments, **keywords):
        connections.append(connect(*arguments, **keywords))
        return connections[-1]

    monkeypatch.setattr(socket, "create_connection", counted_connection)
    ttfts = raw_socket_ttfts(server, bodies, count=6, warmup=2)

    # Eight answers read to their end on one keep-alive connection (a server that
    # closed it, or an answer read short, would fail the next request).
    assert len(ttfts) == 6 and len(connections) == 1


def test_the_ttft_overhead_is_the_client_minus_the_raw_socket(
    chat_requests, server, tmp_path, monkeypatch
):
    raw_rounds = []

    def recorded_raw_socket_ttfts(*arguments, **keywords):
        raw_rounds.append(raw_socket_ttfts(*arguments, **keywords))
        return raw_rounds[-1]

    monkeypatch.setattr(client_roofline, "raw_socket_ttfts", recorded_raw_socket_ttfts)
    figures = measure_ttft_overhead(
        chat_requests,
        server,
        client_cpu=client_and_server_cpus()[0],
        requests_per_round=5,
        rounds=2,
        request_timeout_s=REQUEST_TIMEOUT_S,
        out_dir=tmp_path,
    )

    # The client's TTFTs are its measured requests' in its logs, not its warm-ups'.
    client_rounds = [
        [
            record["ttft_ms"]
            for record in read_request_log(tmp_path / f"ttft-round{number}.jsonl")
            if record["phase"] == "measured"
        ]
        for number in (1, 2)
    ]
    assert [len(ttfts) for ttfts in client_rounds + raw_rounds] == [5, 5, 5, 5]
    assert figures["requests_each"] == 10
    client_p50 = statistics.median(client_rounds[0] + client_rounds[1])
    raw_p50 = statistics.median(raw_rounds[0] + raw_rounds[1])
    assert figures["client_ttft_ms_p50"] == pytest.approx(client_p50, abs=0.001)
    assert figures["raw_socket_ttft_ms_p50"] == pytest.approx(raw_p50, abs=0.001)
    assert figures["client_ttft_overhead_ms_p50"] == pytest.approx(
        client_p50 - raw_p50, abs=0.002
    )
    each_round = [
        statistics.median(client) - statistics.median(raw)
        for client, raw in zip(client_rounds, raw_rounds, strict=True)
    ]
    assert figures["overhead_ms_median_of_rounds"] == pytest.approx(
        statistics.median(each_round), abs=0.002
    )


def test_a_client_that_falls_behind_its_schedule_makes_the_run_invalid(
    chat_requests, server, tmp_path
):
    verdicts = check_dispatch_lag_invalidation(
        chat_requests,
        server,
        block_s=0.3,
        allowed_ms=100,
        request_timeout_s=REQUEST_TIMEOUT_S,
        out_dir=tmp_path,
    )

    assert verdicts["unblocked_client"]["valid"]
    blocked = verdicts["blocked_client"]
    assert not blocked["valid"]
    assert blocked["dispatch_lag_max_ms"] >= 300
    assert [reason for reason in blocked["invalid_reasons"] if "dispatch lag" in reason]
    assert verdicts["lagging_client_invalidates_run"]
    monitors = json.loads((tmp_path / "blocked_client" / "monitors.json").read_text())
    assert monitors["processes"]["main_pid"] == server.process.pid


# --- Monitors -------------------------------------------------------------------


class BurningTime:
    """``time`` for the monitor-cost module, whose sleeps spin this process's CPU
    instead: the window's sleep then holds work the monitors' cost must count."""

    def __init__(self):
        self.burned = []  # (cpu_s, wall_s) of each sleep

    def __getattr__(self, name):
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        cpu, wall = time.process_time(), time.monotonic()
        block = bytes(1 << 20)
        while time.monotonic() - wall < seconds:
            hashlib.sha256(block)  # without the GIL: the sampler keeps its pace
        self.burned.append((time.process_time() - cpu, time.monotonic() - wall))


@needs_root
def test_the_monitor_cost_counts_this_processs_cpu_over_the_window(
    tmp_path, monkeypatch
):
    """On a tree with many threads, in a cgroup: whatever CPU this process spends
    over the window is the monitors' cost, not only the sampling thread's."""
    name = f"harness-test-{os.getpid()}"
    children_before = own_children()
    clock = BurningTime()
    monkeypatch.setattr(monitor_cost, "time", clock)
    figures = measure_monitor_cpu(
        window_s=0.5,
        threads=16,
        sample_hz=10,
        thread_sample_hz=4,
        group_name=name,
        log_path=tmp_path / "tree.log",
    )

    assert figures["main_threads_sampled"] >= 17
    assert figures["scheduler_found"] and figures["cgroup_read"]
    assert figures["samples"] >= 2
    burned_cpu, burned_wall = clock.burned[-1]  # the window's sleep
    assert figures["sampler_cpu_seconds"] < burned_cpu  # the spin is not the sampler
    assert figures["monitor_cpu_seconds"] >= burned_cpu - 1e-4
    assert figures["window_s"] >= burned_wall - 1e-3
    assert figures["monitor_cpu_fraction"] >= burned_cpu / figures["window_s"] - 1e-4
    assert own_children() <= children_before
    assert name not in {directory.name for directory in project_group_directories()}


# --- Shared-memory copy ---------------------------------------------------------


def test_each_variant_copy_is_timed_beside_memcpy_with_the_server_threads(
    variants, monkeypatch
):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as Snakemake sets it for a job
    roots = {name: Path(v["sglang_python_root"]) for name, v in variants.items()}

    figures = measure_shm_copy(roots, rows=[8, 64], columns=1536, repeats=2)
    summary = summarize_shm_copy(figures, {"tiny": 8, "small": 64})

    assert "OMP_NUM_THREADS" not in figures["thread_settings_in_environment"]
    assert figures["torch_threads"] == len(os.sched_getaffinity(0))
    copies = {
        "variant:original",
        "variant:patched",
        "memcpy_fresh",
        "memcpy_new_segment",
        "memcpy_prefaulted",
    }
    for rows in (8, 64):
        size = figures["sizes"][str(rows)]
        # One float32 tensor of the size's rows, timed by every copy.
        assert size["shape"] == [rows, 1536] and size["bytes"] == rows * 1536 * 4
        assert set(size["gbps_best"]) == set(size["gbps_median"]) == copies
        for copy, best in size["gbps_best"].items():
            assert best >= size["gbps_median"][copy]  # the best of two rounds
    assert set(summary["shm_copy_gbps"]) == {"original", "patched"}
    assert set(summary["memcpy_gbps"]) == {"fresh", "new_segment", "prefaulted"}
    creator = f"_{figures['pid']}_"  # SGLang's segment names and ours hold it
    assert not [name for name in os.listdir("/dev/shm") if creator in name]


def test_each_copy_is_compared_by_its_best_round_with_memcpy_into_fresh_memory():
    def size(original, patched, fresh):
        best = {"variant:original": original, "variant:patched": patched}
        best |= {"memcpy_fresh": fresh, "memcpy_new_segment": 9.0}
        best |= {"memcpy_prefaulted": 20.0}
        return {"gbps_best": best, "gbps_median": dict.fromkeys(best, 0.5)}

    figures = {
        "torch_threads": 2,
        "torch_import_s": 1.5,
        "host_busy_cores": 0.25,
        "sizes": {"8": size(1.0, 3.0, 4.0), "64": size(2.0, 6.0, 5.0)},
    }

    summary = summarize_shm_copy(figures, {"tiny": 8, "small": 64})

    assert summary["shm_copy_gbps"] == {
        "original": {"tiny": 1.0, "small": 2.0},
        "patched": {"tiny": 3.0, "small": 6.0},
    }
    assert summary["memcpy_gbps"] == {
        "fresh": {"tiny": 4.0, "small": 5.0},
        "new_segment": {"tiny": 9.0, "small": 9.0},
        "prefaulted": {"tiny": 20.0, "small": 20.0},
    }
    assert summary["shm_copy_to_memcpy_fresh_ratio"] == {
        "original": {"tiny": 0.25, "small": 0.4},
        "patched": {"tiny": 0.75, "small": 1.2},
    }
    # The patched copy's headline is its worst size beside memcpy.
    assert summary["shm_copy_patched_to_memcpy_ratio"] == 0.75
    assert (summary["torch_threads"], summary["host_busy_cores"]) == (2, 0.25)


# --- The default study's wall time -----------------------------------------------


def write_benchmark(root: Path, job: str, seconds: float) -> Path:
    """A job's benchmark file as Snakemake writes it (tab-separated, ``s`` first)."""
    path = root / "results/benchmarks/jobs" / f"{job}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load"
        f"\tcpu_time\n{seconds}\t0:00:{int(seconds):02d}\t1.0\t2.0\t1.0\t1.0"
        "\t0.0\t0.0\t50.0\t1.5\n"
    )
    return path


def write_run(root: Path, run: str, wall_s: float, measured_s: float) -> Path:
    """A run's records as the arm runner leaves them: its wall time and window."""
    directory = root / "results/exp" / run
    directory.mkdir(parents=True)
    (directory / "provenance.json").write_text(json.dumps({"wall_s": wall_s}))
    (directory / "metrics.json").write_text(
        json.dumps({"measured_seconds": measured_s})
    )
    return directory


def test_the_study_wall_time_sums_its_jobs_and_its_runs(tmp_path):
    jobs = [
        write_benchmark(tmp_path, "fetch_source/s", 7.25),
        write_benchmark(tmp_path, "preflight/exp", 6),
        write_benchmark(tmp_path, "report_html/exp", 5),
    ]
    write_benchmark(tmp_path, "another_rule/x", 100)  # not the study's
    runs = [
        write_run(tmp_path, "A/run1", 24, 10),
        write_run(tmp_path, "B/run1", 20.5, 9),
    ]

    figures = default_study_wall(jobs, [run / "provenance.json" for run in runs])

    assert figures["jobs"] == 5
    assert figures["default_study_wall_s"] == 62.8
    assert figures["seconds_by_rule"] == {
        "fetch_source": 7.2,
        "preflight": 6.0,
        "report_html": 5.0,
        "run_arm": 44.5,
    }
    # The runs' overheads are 14 and 11.5 s; with today's 6 s each: 62.8 - 25.5 + 12.
    estimate = with_current_arm_overhead(figures, runs, 6)
    assert estimate["recorded_arm_overhead_s_median"] == 12.75
    assert estimate["estimated_wall_s_with_measured_arm_overhead"] == 49.3


def test_a_job_without_its_record_leaves_the_study_wall_time_null(tmp_path):
    present = write_benchmark(tmp_path, "preflight/exp", 6)
    run = write_run(tmp_path, "A/run1", 24, 10) / "provenance.json"
    missing = tmp_path / "results/benchmarks/jobs/aggregate/exp.tsv"
    figures = default_study_wall([present, missing], [run])
    assert figures["default_study_wall_s"] is None
    assert str(missing) in figures["reason"]
    figures = default_study_wall([present], [tmp_path / "results/exp/B/run1/x.json"])
    assert figures["default_study_wall_s"] is None
    no_runs = default_study_wall([present], [])
    assert no_runs == {"default_study_wall_s": None, "reason": "the study has no runs"}


# --- One real arm -----------------------------------------------------------------


@needs_root
@pytest.mark.slow
def test_a_real_arm_is_split_into_its_phases(variants, tmp_path_factory, tmp_path):
    children_before = own_children()
    workload = tmp_path_factory.mktemp("arm-workload") / "tiny"
    spec = {"name": "tiny", "seed": 1, "images": 4, "width": 128, "height": 128}
    generate_workload(spec | {"input_tokens": 8, "format": "png"}, workload)
    arm = embedded_arm("overhead", requests=24, output_tokens=8)

    figures = measure_arm_overhead(
        arm=arm,
        variant=Variant.from_identity(variants["original"]),
        workload_manifest=workload / "manifest.json",
        out_dir=tmp_path,
        # Only the phases are in question, not what else the host did meanwhile.
        sharing=HostSharing.from_config(
            {"max_other_load_cores": 4096, "max_steal_cores": 4096}
        ),
        **embedded_run_settings(
            decode_step_ms=5, warmup_requests=4, health_timeout_s=120
        ),
    )

    assert figures["valid"], figures["invalid_reasons"]
    phases = figures["phases_s"]
    assert all(seconds is not None and seconds >= 0 for seconds in phases.values())
    in_sequence = sum(
        phases[name]
        for name in (
            "main_process_start",
            "scheduler_start",
            "server_warmup_request",
            "healthy_to_client_start",
            "client_warmup",
            "measured_window",
            "after_measured",
            "teardown",
        )
    )
    # The phases follow each other from launch to return; only the few ms between
    # the main process's readiness and the scheduler's start are not in a phase.
    assert in_sequence == pytest.approx(figures["arm_wall_s"], abs=0.5)
    # What the overhead leaves out of the run's wall time is its measured window,
    # as the client's clock has it: the overhead is the phases around the window.
    assert figures["arm_wall_s"] - figures["arm_overhead_s"] == pytest.approx(
        phases["measured_window"], abs=0.01
    )
    assert own_children() <= children_before


def test_goals_are_judged_against_their_bounds():
    verdicts = goals_met(
        {
            "client_headroom_ratio": 200.0,
            "client_ttft_overhead_ms_p50": 0.15,
            "monitor_cpu_fraction": None,
        }
    )

    assert verdicts["client_headroom_ratio"]["met"] is True
    assert verdicts["client_ttft_overhead_ms_p50"]["met"] is False
    assert verdicts["monitor_cpu_fraction"]["met"] is None


def test_a_benchmarks_host_load_names_the_hypervisors_steal():
    before = CpuReading(
        at=10.0, host_busy_seconds=100.0, own_seconds=4.0, host_steal_seconds=7.0
    )
    after = CpuReading(
        at=12.0, host_busy_seconds=103.0, own_seconds=6.0, host_steal_seconds=8.2
    )
    assert host_load_between(before, after) == {
        "host_busy_cores": 1.5,
        "steal_cores": 0.6,
        "other_processes_cores": 0.5,
    }
