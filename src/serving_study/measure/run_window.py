"""The measured window of one run on a healthy server: warm-up, then the window.

Warm-up and measured requests form one load: a closed loop at the arm's
concurrency, or with a request rate one schedule of seeded arrivals (arrivals.py),
drawn for the run's block before the clock starts. The monitors' window opens as
the first measured request is sent, with the pipeline already full, and closes when
the last one ends.
"""

import asyncio
import logging
from pathlib import Path

from serving_study.config.records import Arm, ClientSettings, MonitorSettings
from serving_study.measure.arrivals import arrival_schedule
from serving_study.measure.chat_requests import load_requests
from serving_study.measure.client import run_load
from serving_study.measure.host_load import HostLoadMeter
from serving_study.measure.monitors import RunMonitors
from serving_study.measure.run_failure import ArmFailed
from serving_study.measure.run_outputs import RunPaths
from serving_study.servers.local_runtime import LocalServer

log = logging.getLogger(__name__)


def measure(
    base_url: str,
    server: LocalServer,
    arm: Arm,
    model: str,
    workload_manifest: Path,
    client: ClientSettings,
    monitors: MonitorSettings,
    paths: RunPaths,
    *,
    block: int,
) -> tuple[dict, dict]:
    """Warm-up, then the measured requests (asking for ``model``) inside the
    monitors' window; the window's figures and the client's summary. ``block`` is
    the run block (the run's number), whose arrivals an open loop sends."""
    chat_requests = load_requests(workload_manifest)
    arrivals = arrival_schedule(
        arm,
        workload_manifest,
        block=block,
        count=client.warmup_requests + arm.requests,
    )
    server.remember_tree()
    # The run's own CPU: every group of its server (the model processes' too).
    own_groups = (server.group, getattr(server, "model_group", None))
    run_monitors = RunMonitors(
        server.pid,
        server.group,
        sample_hz=monitors.sample_hz,
        thread_sample_hz=monitors.thread_sample_hz,
        gpu=monitors.gpu,
        host_load=HostLoadMeter([group for group in own_groups if group]),
    )
    window: dict = {}
    try:
        run_monitors.discover()
        log.info(
            "%d warm-up then %d measured requests at concurrency %d",
            client.warmup_requests,
            arm.requests,
            arm.concurrency,
        )
        if arrivals is not None:
            log.info("open loop: %s, arrivals %s", arm.load, arrivals.record())
        summary = asyncio.run(
            run_load(
                base_url,
                chat_requests,
                concurrency=arm.concurrency,
                measured_requests=arm.requests,
                warmup_requests=client.warmup_requests,
                output_tokens=arm.output_tokens,
                model=model,
                out_path=paths.requests,
                progress=True,
                request_timeout_s=client.request_timeout_s,
                arrivals=arrivals,
                on_measured_start=run_monitors.start_window,
                on_measured_end=lambda: window.update(run_monitors.stop_window()),
            )
        )
    finally:
        run_monitors.stop()
    if not window:
        raise ArmFailed("the measured window never closed (the client stopped early)")
    return window, summary.to_dict()
