"""One run of SGLang's own ``bench_serving`` against a fresh server of an arm.

The server starts from the arm's launch plan as our runs start it
(``measure.server_start``), in its cgroup under the arm's quota; bench_serving runs
beside it as a child of the runner, outside that cgroup, as our client does. It
comes from the arm's variant's release (``python -m sglang.benchmark.serving``,
the module ``sglang.bench_serving`` forwards to) in the real server's CPU runtime,
offline: it reads the model's tokenizer from a local folder and is given the name
the server serves, so it never looks anything up on the Hub.

The monitors' window follows bench_serving's own: it opens one second after the
line saying its warm-up is done (it sleeps that second before its clock starts)
and closes at its results banner. The window's host load counts bench_serving's
CPU as the run's own, as it counts our client's, and its CPU per request over the
window is kept beside the run's figures. The run is then judged as ours
are, on the same server, quota, environment and host-load checks
(``run_validity.server_reasons``); its requests are judged on bench_serving's
result: every one completed, as many as asked.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
)
from serving_study.launch.plan import LaunchPlan
from serving_study.measure.host_load import HostLoadMeter
from serving_study.measure.monitors import RunMonitors
from serving_study.measure.process_counters import cpu_seconds_and_threads
from serving_study.measure.run_failure import (
    ArmFailed,
    FailedOutsideTheArm,
    failure_reason,
)
from serving_study.measure.run_metrics import (
    cpu_per_request,
    failed_run_metrics,
    monitor_figures,
)
from serving_study.measure.run_outputs import RunPaths, now_iso, write_json
from serving_study.measure.run_validity import (
    SHM_WAS_FULL,
    only_outside_the_arm,
    server_reasons,
)
from serving_study.measure.server_checks import server_identity, validity_checks
from serving_study.measure.server_queries import read_server_info
from serving_study.measure.server_start import start_healthy_server
from serving_study.servers.cpu_group import CpuStat
from serving_study.servers.leftovers import reap_leftovers
from serving_study.servers.owners import owned_name
from serving_study.studies.bench_serving_result import figures, read_result

log = logging.getLogger(__name__)

MODULE = "sglang.benchmark.serving"
# What bench_serving 0.5.23 prints once its warm-up is done; it then sleeps a
# second before its clock starts. Its results follow the banner.
WARMUP_DONE = "Starting main benchmark run"
AFTER_WARMUP_S = 1.0
RESULTS_BANNER = " Serving Benchmark Result "
# Its start (imports, tokenizer, dataset) before it sends anything.
START_ALLOWANCE_S = 600


@dataclass(frozen=True)
class BenchServing:
    """How bench_serving runs: the runtime's Python, the release's ``python/``
    folder (put first on its PYTHONPATH) and a local model folder whose
    tokenizer and chat template it reads."""

    python: str
    sglang_python_root: str
    tokenizer: str

    def argv(
        self,
        *,
        base_url: str,
        dataset: Path,
        requests: int,
        concurrency: int,
        warmup_requests: int,
        served_model_name: str,
        output_file: Path,
    ) -> list[str]:
        """Closed loop at ``concurrency`` (rate unbounded, the default), the
        dataset's first ``requests`` lines in order, results with their
        per-request details."""
        return [
            self.python,
            "-m",
            MODULE,
            "--backend=sglang-oai-chat",
            f"--base-url={base_url}",
            "--dataset-name=openai",
            f"--dataset-path={dataset}",
            f"--num-prompts={requests}",
            f"--max-concurrency={concurrency}",
            f"--warmup-requests={warmup_requests}",
            f"--model={self.tokenizer}",
            f"--tokenizer={self.tokenizer}",
            f"--served-model-name={served_model_name}",
            f"--output-file={output_file}",
            "--output-details",
            "--disable-tqdm",
        ]

    def environment(self, inherited: dict[str, str]) -> dict[str, str]:
        """The runner's environment with the release first on the path, the Hub
        offline and the output unbuffered (the runner follows it line by line)."""
        return {
            **{
                name: value for name, value in inherited.items() if name != "PYTHONPATH"
            },
            "PYTHONPATH": self.sglang_python_root,
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }


@dataclass(frozen=True)
class BenchServingPaths:
    """The files of one bench_serving run: the run's own (``run``: metrics,
    monitors, provenance and server log; it writes no request log), its result
    file and its console output."""

    run: RunPaths
    result: Path
    console: Path

    @classmethod
    def in_directory(cls, directory: Path) -> BenchServingPaths:
        return cls(
            run=RunPaths.in_directory(directory),
            result=directory / "bench_serving.json",
            console=directory / "bench_serving.log",
        )


class ProcessCpu:
    """A process whose CPU counts as the run's own (bench_serving), read the way
    the host-load meter reads a control group."""

    def __init__(self, pid: int):
        self.pid = pid
        self.last = 0.0

    def read_stat(self) -> CpuStat:
        seconds, _ = cpu_seconds_and_threads(self.pid)
        self.last = self.last if seconds is None else seconds
        return CpuStat(self.last, 0, 0, 0.0, time.monotonic())


def run_bench_serving(
    *,
    experiment: str,
    arm: Arm,
    label: str,
    plan: LaunchPlan,
    bench: BenchServing,
    dataset: Path,
    client: ClientSettings,
    monitors: MonitorSettings,
    sharing: HostSharing,
    paths: BenchServingPaths,
    traced_to: dict | None = None,
) -> dict:
    """bench_serving against a fresh server of ``plan``; write the run's files and
    return its metrics. The caller holds the host's measurement lock."""
    paths.run.server_log.write_text("")
    started_at, started = now_iso(), time.monotonic()
    provenance = {
        "experiment": experiment,
        "arm": arm.as_config(),
        "run": label,
        "client": "bench_serving",
        "started_at": started_at,
        **(traced_to or {}),
    }
    server = None
    metrics: dict
    try:
        container_runtimes = (plan.container.runtime,) if plan.in_container else ()
        provenance["leftovers_reaped"] = reap_leftovers(container_runtimes).to_dict()
        server, base_url = start_healthy_server(
            plan,
            owned_name(f"{experiment}-{arm.name}-{label}"),
            paths.run,
            client.health_timeout_s,
        )
        server_info = read_server_info(base_url)
        argv = bench.argv(
            base_url=base_url,
            dataset=dataset,
            requests=arm.requests,
            concurrency=arm.concurrency,
            warmup_requests=client.warmup_requests,
            served_model_name=plan.served_model_name,
            output_file=paths.result,
        )
        provenance.update(
            launch=server.plan.record(),
            server_info=server_info,
            quota_in_force=server.group.quota_in_force(),
            bench_serving_argv=argv,
        )
        paths.result.unlink(missing_ok=True)
        window = _measure(argv, bench, server, arm, client, monitors, paths)
        if server.exit_code() is not None:
            raise ArmFailed(
                f"server exited with code {server.exit_code()} during the run\n"
                f"{server.log_tail()}"
            )
        identity = server_identity(plan, server_info, server)
        checks = validity_checks(
            plan, client, server_info, window, server, identity, sharing=sharing
        )
        inline = read_server_info(base_url).get("inline_fallbacks", 0)
        inline -= server_info.get("inline_fallbacks", 0)
        write_json(paths.run.monitors, window)
        result = read_result(paths.result)
        metrics = _metrics(result, window, arm, checks, label)
        if inline:
            _invalid(metrics, f"{inline} images went inline {SHM_WAS_FULL}")
    except Exception as failure:
        reason = failure_reason(failure, provenance)
        log.error("bench_serving run failed: %s", reason)
        metrics = failed_run_metrics(
            arm,
            None,
            (reason or "?").splitlines()[0],
            outside_the_arm=isinstance(failure, FailedOutsideTheArm),
        )
        metrics.update(run=label, client="bench_serving")
        provenance["failure"] = reason
        if not paths.run.monitors.exists():
            paths.run.monitors.write_text("null\n")
    finally:
        if server is not None:
            server.stop()
            provenance["leaked_segments_removed"] = server.leaked_segments
    if server is not None and server.leaked_segments:
        reason = f"the server left {len(server.leaked_segments)} shared-memory segments"
        _invalid(metrics, reason)
    provenance.update(
        finished_at=now_iso(), wall_s=round(time.monotonic() - started, 3)
    )
    metrics.update(experiment=experiment)
    write_json(paths.run.provenance, provenance)
    write_json(paths.run.metrics, metrics)
    log.info(
        "bench_serving %s/%s: valid=%s throughput=%s req/s",
        arm.name,
        label,
        metrics.get("valid"),
        metrics.get("throughput_rps"),
    )
    return metrics


def _measure(
    argv: list[str],
    bench: BenchServing,
    server,
    arm: Arm,
    client: ClientSettings,
    monitors: MonitorSettings,
    paths: BenchServingPaths,
) -> dict:
    """Run bench_serving to its end with the monitors' window around its measured
    requests; the window's figures."""
    server.remember_tree()
    own_groups = [g for g in (server.group, getattr(server, "model_group", None)) if g]
    deadline_s = START_ALLOWANCE_S + client.request_timeout_s * (
        1 + (client.warmup_requests + arm.requests) / arm.concurrency
    )
    window: dict = {}
    with open(paths.console, "w") as console:
        process = subprocess.Popen(
            argv,
            env=bench.environment(dict(os.environ)),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        client_cpu = ProcessCpu(process.pid)
        run_monitors = RunMonitors(
            server.pid,
            server.group,
            sample_hz=monitors.sample_hz,
            thread_sample_hz=monitors.thread_sample_hz,
            gpu=monitors.gpu,
            host_load=HostLoadMeter([*own_groups, client_cpu]),
        )
        cpu_at_start = []

        def open_window() -> None:
            cpu_at_start.append(client_cpu.read_stat().usage_seconds)
            run_monitors.start_window()

        opening = threading.Timer(AFTER_WARMUP_S, open_window)
        watchdog = threading.Timer(deadline_s, process.kill)
        watchdog.start()
        try:
            run_monitors.discover()
            for line in process.stdout:
                console.write(line)
                if WARMUP_DONE in line:
                    opening.start()
                elif RESULTS_BANNER in line and opening.ident is not None:
                    opening.join()  # a run shorter than a second waits for it
                    window = run_monitors.stop_window()
                    cpu = client_cpu.read_stat().usage_seconds - cpu_at_start[0]
                    window["client_cpu_seconds"] = round(cpu, 3)
            code = process.wait()
        finally:
            watchdog.cancel()
            opening.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
            run_monitors.stop()
    if code != 0:
        raise ArmFailed(
            f"bench_serving ended with code {code} (see {paths.console.name})"
        )
    if not window:
        raise ArmFailed(f"bench_serving printed no results (see {paths.console.name})")
    return window


def _metrics(result: dict, window: dict, arm: Arm, checks: dict, label: str) -> dict:
    """The run's metrics: bench_serving's figures under our names, the server's
    CPU over the window, and whether it counts."""
    errors = [error for error in result.get("errors", []) if error]
    reasons = []
    if errors:
        reasons.append(
            f"{len(errors)} of {arm.requests} measured requests did not complete "
            f"(first: {errors[0].strip().splitlines()[-1][:200]})"
        )
    if result["completed"] + len(errors) != arm.requests:
        reasons.append(
            f"bench_serving answered {result['completed'] + len(errors)} measured "
            f"requests, the run asks for {arm.requests}"
        )
    reasons += server_reasons(window, arm, checks)
    metrics = {
        "arm": arm.name,
        "run": label,
        "client": "bench_serving",
        "concurrency": arm.concurrency,
        **figures(result),
        **monitor_figures(window),
    }
    metrics |= cpu_per_request(metrics)
    if result["completed"]:
        cpu_ms = 1000 * window["client_cpu_seconds"] / result["completed"]
        metrics["client_cpu_ms_per_request"] = cpu_ms
    return metrics | {
        "valid": not reasons,
        "invalid_reasons": reasons,
        "outside_the_arm": only_outside_the_arm(reasons, window, checks),
        "checks": checks,
    }


def _invalid(metrics: dict, reason: str) -> None:
    reasons = [*(metrics.get("invalid_reasons") or []), reason]
    metrics.update(valid=False, outside_the_arm=False, invalid_reasons=reasons)
