"""Our client against SGLang's own bench_serving: one pair of runs of an arm.

A pair is two runs of the arm, each on a fresh server started from the arm's
launch plan: one with our client (the arm runner's own run, ``run_arm``), one with
bench_serving (``bench_serving_run``), both outside the server's cgroup, with the
same images, prompt, output tokens, warm-up count and concurrency. Odd pairs run
ours first, even pairs bench_serving first, so neither client always meets the
host a few minutes later. The pair holds the host's measurement lock from before
its first server starts to after its second stops.

bench_serving reads our workload as its ``openai`` dataset
(``bench_serving_dataset``), written for the pair and removed after it.

A pair where either run is invalid only for a reason outside the arm (other load
on the host, steal, a server that never became healthy) is measured again, both
runs, once the host has been quiet, up to ``host_sharing.retries`` times, as a
study's runs are (run_attempts.py). Every attempt's figures and reasons stay in
``pair.json``; the run files are the last attempt's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serving_study.analysis.crosscheck_table import CLIENTS, OURS, THEIRS
from serving_study.config.crosscheck_settings import ClientCrosscheck
from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    Variant,
)
from serving_study.launch.plan import LaunchPlan
from serving_study.measure.arm_runner import run_arm
from serving_study.measure.host_load import wait_for_quiet_host
from serving_study.measure.host_sharing import MeasurementLock
from serving_study.measure.run_attempts import failed_outside_the_arm
from serving_study.measure.run_failure import termination_as_interrupt
from serving_study.measure.run_outputs import RunPaths, write_json
from serving_study.studies.bench_serving_dataset import write_dataset
from serving_study.studies.bench_serving_run import (
    BenchServing,
    BenchServingPaths,
    run_bench_serving,
)

log = logging.getLogger(__name__)


def pair_order(pair: int) -> tuple[str, str]:
    """Which client runs first: ours in odd pairs, bench_serving in even ones."""
    return CLIENTS if pair % 2 else CLIENTS[::-1]


def crosscheck_arm(arm: Arm, crosscheck: ClientCrosscheck) -> Arm:
    """The arm as both clients run it: the cross-check's measured requests."""
    return dataclasses.replace(arm, requests=crosscheck.measured_requests(arm))


@dataclass(frozen=True)
class PairPaths:
    """Where a pair's runs go: ``ours/`` (a run's usual files), ``bench_serving/``
    (its run's, and the dataset it reads, there only while the pair runs),
    ``dataset.json`` (what the dataset held) and ``pair.json``."""

    ours: RunPaths
    theirs: BenchServingPaths
    dataset: Path
    dataset_record: Path
    record: Path

    @classmethod
    def in_directory(cls, directory: Path) -> PairPaths:
        for client in CLIENTS:
            (directory / client).mkdir(parents=True, exist_ok=True)
        return cls(
            ours=RunPaths.in_directory(directory / OURS),
            theirs=BenchServingPaths.in_directory(directory / THEIRS),
            dataset=directory / THEIRS / "dataset.jsonl",
            dataset_record=directory / "dataset.json",
            record=directory / "pair.json",
        )


@termination_as_interrupt()
def measure_pair(
    *,
    experiment: str,
    arm: Arm,
    pair: int,
    plan: LaunchPlan,
    variant: Variant,
    workload_manifest: Path,
    bench: BenchServing,
    client: ClientSettings,
    monitors: MonitorSettings,
    sharing: HostSharing,
    paths: PairPaths,
    traced_to: dict | None = None,
) -> dict:
    """Measure pair ``pair`` of ``arm`` (already given the cross-check's
    requests), retrying after a quiet host as ``sharing`` allows; write and
    return its record."""
    # About 270 kB a 512 px image, so the dataset lives only while the pair runs.
    dataset = write_dataset(
        workload_manifest,
        paths.dataset,
        warmup_requests=client.warmup_requests,
        measured_requests=arm.requests,
        output_tokens=arm.output_tokens,
    )
    write_json(paths.dataset_record, dataset)
    order = pair_order(pair)
    holder = f"experiment {experiment}, arm {arm.name}, client cross-check {pair}"
    try:
        with MeasurementLock.acquire(sharing, holder) as lock:
            attempts = _attempts(
                order,
                sharing,
                ours=lambda: run_arm(
                    experiment=experiment,
                    arm=arm,
                    run=pair,
                    variant=variant,
                    workload_manifest=workload_manifest,
                    plan=plan,
                    client=client,
                    monitors=monitors,
                    paths=paths.ours,
                    sharing=sharing,
                    traced_to=traced_to,
                    lock=lock,
                ),
                theirs=lambda: run_bench_serving(
                    experiment=experiment,
                    arm=arm,
                    label=f"crosscheck{pair}",
                    plan=plan,
                    bench=bench,
                    dataset=paths.dataset,
                    client=client,
                    monitors=monitors,
                    sharing=sharing,
                    paths=paths.theirs,
                    traced_to=traced_to,
                ),
            )
    finally:
        paths.dataset.unlink(missing_ok=True)
    record = {
        "experiment": experiment,
        "arm": arm.name,
        "pair": pair,
        "order": list(order),
        "requests": arm.requests,
        "concurrency": arm.concurrency,
        "attempts": attempts,
    }
    write_json(paths.record, record)
    return record


def _attempts(
    order: tuple[str, str],
    sharing: HostSharing,
    *,
    ours: Callable[[], dict],
    theirs: Callable[[], dict],
) -> list[dict]:
    """Both runs in ``order``, again after a quiet host while either fails only
    outside the arm (as ``sharing`` allows); each attempt's outcome."""
    run = {OURS: ours, THEIRS: theirs}
    attempts = []
    for tries_left in range(sharing.retries, -1, -1):
        metrics = {name: run[name]() for name in order}
        attempts.append({name: _attempt(metrics[name]) for name in CLIENTS})
        outside = [name for name in CLIENTS if failed_outside_the_arm(metrics[name])]
        if not outside or not tries_left:
            break
        log.warning(
            "%s invalid only for a reason outside the arm; %d more tries, each "
            "after the host has been quiet for %g s",
            " and ".join(outside),
            tries_left,
            sharing.quiet_for_s,
        )
        quiet = wait_for_quiet_host(sharing)
        attempts[-1]["then_waited_for_quiet_s"] = quiet["waited_s"]
        if not quiet["quiet"]:
            log.warning("the host stayed busy: no more tries")
            break
    return attempts


def _attempt(metrics: dict) -> dict:
    return {
        "valid": metrics.get("valid"),
        "throughput_rps": metrics.get("throughput_rps"),
        "invalid_reasons": metrics.get("invalid_reasons") or [],
    }
