"""That a client which falls behind its schedule makes a run invalid."""

import asyncio
import json
import time
from pathlib import Path

from serving_study.config.records import Arm
from serving_study.measure.chat_requests import ChatRequest
from serving_study.measure.client import run_load
from serving_study.measure.monitors import RunMonitors
from serving_study.measure.run_metrics import summarize_run
from serving_study.studies.harness.zero_work import OUTPUT_TOKENS, RunningServer
from serving_study.studies.zero_work_server import MODEL as ZERO_WORK_MODEL


def check_dispatch_lag_invalidation(
    chat_requests: list[ChatRequest],
    server: RunningServer,
    *,
    block_s: float,
    allowed_ms: float,
    request_timeout_s: float,
    out_dir: Path,
    concurrency: int = 4,
    measured_requests: int = 40,
) -> dict:
    """Two arm-like runs, one with the client's event loop blocked, and their verdicts.

    Both run the real client with the real monitors' window against the zero-work
    server and are judged by `summarize_run`, as the arm runner does. In the blocked
    run the hook that opens the window first holds the event loop for `block_s`, as a
    client thread starved of CPU would: the next request leaves that much late.
    """
    verdicts = {}
    for blocked in (False, True):
        name = "blocked_client" if blocked else "unblocked_client"
        directory = out_dir / name
        directory.mkdir(parents=True, exist_ok=True)
        monitors = RunMonitors(server.process.pid, None, gpu=False)
        window: dict = {}

        def open_window(blocked: bool = blocked, monitors: RunMonitors = monitors):
            if blocked:
                time.sleep(block_s)  # the client's thread does something else
            monitors.start_window()

        try:
            monitors.discover()
            asyncio.run(
                run_load(
                    server.base_url,
                    chat_requests,
                    concurrency=concurrency,
                    measured_requests=measured_requests,
                    warmup_requests=concurrency,
                    output_tokens=OUTPUT_TOKENS,
                    model=ZERO_WORK_MODEL,
                    out_path=directory / "requests.jsonl",
                    progress=False,
                    request_timeout_s=request_timeout_s,
                    on_measured_start=open_window,
                    on_measured_end=lambda w=window, m=monitors: w.update(
                        m.stop_window()
                    ),
                )
            )
        finally:
            monitors.stop()
        (directory / "monitors.json").write_text(json.dumps(window))
        # Everything else is the schema's default: no environment, threads or arguments.
        arm = Arm.from_config(
            {
                "name": name,
                "variant": "zero-work",
                "workload": "zero-work",
                "cpu_quota": "none",
                "concurrency": concurrency,
                "requests": measured_requests,
                "output_tokens": OUTPUT_TOKENS,
            }
        )
        checks = {
            "quota_in_force_cores": None,
            "max_dispatch_lag_ms_allowed": allowed_ms,
            "warmup_requests": concurrency,
        }
        metrics = summarize_run(
            directory / "requests.jsonl", directory / "monitors.json", arm, checks, 1
        )
        verdicts[name] = {
            "valid": metrics["valid"],
            "invalid_reasons": metrics["invalid_reasons"],
            "dispatch_lag_max_ms": metrics["dispatch_lag_max_ms"],
        }
    blocked_verdict = verdicts["blocked_client"]
    return {
        "block_s": block_s,
        "max_dispatch_lag_ms_allowed": allowed_ms,
        **verdicts,
        "lagging_client_invalidates_run": (
            verdicts["unblocked_client"]["valid"]
            and not blocked_verdict["valid"]
            and any("dispatch lag" in r for r in blocked_verdict["invalid_reasons"])
        ),
    }
