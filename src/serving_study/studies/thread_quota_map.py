"""Throughput over intra-op threads x CPU quota: where the copy's fan-out hurts.

The study measured one point (128 threads under 13.6 cores). The map measures a
grid for each copy variant: rows are forced intra-op thread counts, columns CPU
quotas (``none`` = no quota). A server's main process is given its thread count
with ``torch.set_num_threads`` (``OMP_NUM_THREADS`` cannot exceed the visible
CPUs: torch clamps it), and the quota is rewritten on its live cgroup between
cells, as ``docker update --cpus`` does. Every cell gets its own warm-up and
measured window, monitors and checks.

The map runs in seeded shuffled blocks, so that drift on the host cannot pose
as a difference between variants. A block measures every (variant, threads,
quota) cell once: its thread counts come in a seeded order; for each, one fresh
server per variant runs side by side, and their (variant, quota) cells are
measured in a seeded shuffled order, so each variant contrast is paired within a
few seconds. Restarting a server per cell would make a 96-cell block cost
minutes of start-up; the thread count, the one thing a restart would reset, is
fixed per server.

A cell that cannot be measured is recorded as invalid with its reason; after
a server died, its remaining cells say so. Nothing invalid is drawn.
"""

import contextlib
import dataclasses
import itertools
import logging
import random
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    ServerSettings,
    Variant,
    quota_cores,
)
from serving_study.launch.engines import launch_plan
from serving_study.measure.host_sharing import MeasurementLock
from serving_study.measure.run_failure import ArmFailed, termination_as_interrupt
from serving_study.measure.run_metrics import failed_run_metrics, summarize_run
from serving_study.measure.run_outputs import RunPaths, now_iso, write_json
from serving_study.measure.run_window import measure
from serving_study.measure.server_checks import server_identity, validity_checks
from serving_study.measure.server_queries import read_server_info
from serving_study.measure.server_start import start_healthy_server
from serving_study.servers.environment import recorded_environment
from serving_study.servers.owners import owned_name

log = logging.getLogger(__name__)

# The figures a cell keeps in the map's table (a cell is one measured window).
CELL_FIGURES = (
    "throughput_rps",
    "ttft_p50_ms",
    "main_cpu_percent",
    "cores_used",
    "throttled_share",
    "torch_threads",
    "gpu_util_percent",
)
# Where a cell stands: its block, its place in the block's order, and which cell it is.
CELL_PLACE = ("block", "position", "variant", "intra_op_threads", "cpu_quota")
TABLE_COLUMNS = (*CELL_PLACE, "valid", *CELL_FIGURES, "invalid_reason")


def quota_label(quota: float | str | None) -> str:
    """A quota as a directory name and a table value: ``2``, ``1.5`` or ``none``
    (from the config's value or an arm's cores)."""
    cores = quota_cores(quota)
    return "none" if cores is None else f"{cores:g}"


@dataclasses.dataclass(frozen=True)
class ServerRound:
    """One thread count within a block: its servers (one per variant) and the
    (variant, quota) cells measured on them, in execution order."""

    threads: int
    cells: tuple[tuple[str, float | str], ...]


def block_plan(settings: Mapping, seed: int, block: int) -> list[ServerRound]:
    """Block ``block`` of the map: every cell once, in an order drawn from the
    seed and the block number alone (the same on any host)."""
    draw = random.Random(f"{seed}-map-block-{block}")
    threads = list(settings["intra_op_threads"])
    draw.shuffle(threads)
    rounds = []
    for count in threads:
        cells = list(itertools.product(settings["variants"], settings["cpu_quotas"]))
        draw.shuffle(cells)
        rounds.append(ServerRound(count, tuple(cells)))
    return rounds


def cell_arm(settings: Mapping, variant: str, threads: int, quota) -> Arm:
    """One cell as an arm, so that the arm runner's parts serve it: the map's
    settings, the server's variant and threads, the cell's quota on the whole
    server, and nothing else (no environment, secrets or server arguments)."""
    return Arm.from_config(
        {
            "name": f"{variant}-threads{threads}-quota{quota_label(quota)}",
            "variant": variant,
            "workload": settings["workload"],
            "transport": settings["transport"],
            "cpu_quota": quota,
            "quota_scope": "server",
            "environment": {},
            "secret_environment": [],
            "concurrency": settings["concurrency"],
            "requests": settings["requests"],
            "output_tokens": settings["output_tokens"],
            "intra_op_threads": threads,
            "server_args": [],
        }
    )


@dataclasses.dataclass(frozen=True)
class MapContext:
    """What every server and cell of one block shares: ``settings`` is the config's
    ``thread_quota_map`` section; ``traced_to`` holds each variant's provenance,
    which its servers' records carry."""

    experiment: str
    settings: Mapping
    block: int
    variants: Mapping[str, Variant]
    workload_manifest: Path
    server_settings: ServerSettings
    client: ClientSettings
    monitors: MonitorSettings
    block_dir: Path
    traced_to: Mapping[str, dict]


@termination_as_interrupt()
def run_map_block(context: MapContext, seed: int, sharing: HostSharing) -> list[dict]:
    """Measure the context's block of the map; return its cells' metrics in the
    order they ran. The block holds the host's measurement lock from before its
    first server starts until its last has stopped, as an arm's run does."""
    # Each cell warms up as many requests as the map's settings say.
    client = dataclasses.replace(
        context.client, warmup_requests=context.settings["warmup_requests"]
    )
    context = dataclasses.replace(context, client=client)
    context.block_dir.mkdir(parents=True, exist_ok=True)
    cells: list[dict] = []
    holder = f"experiment {context.experiment}, map block {context.block}"
    with MeasurementLock.acquire(sharing, holder=holder) as lock:
        for server_round in block_plan(context.settings, seed, context.block):
            cells += run_round(context, server_round, lock.record, first=len(cells))
    return cells


def run_round(
    context: MapContext, server_round: ServerRound, lock_record: dict, first: int
) -> list[dict]:
    """One thread count: a fresh server per variant, side by side, then the round's
    cells in their order; every server is stopped on the way out."""
    threads = server_round.threads
    with contextlib.ExitStack() as servers:
        started: dict[str, tuple] = {}
        why_not: dict[str, str] = {}
        for variant_name in dict.fromkeys(v for v, _ in server_round.cells):
            first_quota = next(q for v, q in server_round.cells if v == variant_name)
            try:
                server, base_url = start_round_server(
                    context, variant_name, threads, first_quota, lock_record
                )
            except ArmFailed as failure:
                # On failure it has stopped its server already.
                why_not[variant_name] = (
                    f"the cell's server never served: {str(failure).splitlines()[0]}"
                )
                continue
            servers.callback(server.stop)
            started[variant_name] = (server, base_url)
        cells = []
        for offset, (variant_name, quota) in enumerate(server_round.cells):
            arm = cell_arm(context.settings, variant_name, threads, quota)
            server, base_url = started.get(variant_name, (None, None))
            reason = why_not.get(variant_name)
            if server is not None and server.exit_code() is not None:
                reason = f"the cell's server had exited (code {server.exit_code()})"
            if reason is None:
                cell = measure_cell(context, server, base_url, arm)
            else:
                cell = failed_cell(arm, reason)
            cells.append(cell | {"block": context.block, "position": first + offset})
    for cell in cells:
        cell_dir = cell_directory(
            context, cell["variant"], int(cell["intra_op_threads"]), cell["cpu_quota"]
        )
        write_json(cell_dir / "metrics.json", cell)
    return cells


def server_directory(context: MapContext, variant_name: str, threads: int) -> Path:
    return context.block_dir / f"{variant_name}-threads{threads}"


def cell_directory(context: MapContext, variant_name: str, threads: int, quota) -> Path:
    """Where one cell's request log, monitors and metrics go; the cell's directory
    exists on return."""
    quota_dir = f"quota-{quota_label(quota)}"
    cell_dir = server_directory(context, variant_name, threads) / quota_dir
    cell_dir.mkdir(parents=True, exist_ok=True)
    return cell_dir


def start_round_server(
    context: MapContext, variant_name: str, threads: int, quota, lock_record: dict
):
    """Start one variant's server with ``threads`` intra-op threads and record it."""
    server_dir = server_directory(context, variant_name, threads)
    server_dir.mkdir(parents=True, exist_ok=True)
    server_paths = RunPaths.in_directory(server_dir)
    server_paths.server_log.write_text("")
    group_name = owned_name(
        f"{context.experiment}-map{context.block}-{variant_name}-t{threads}"
    )
    plan = launch_plan(
        context.server_settings,
        cell_arm(context.settings, variant_name, threads, quota),
        context.variants[variant_name],
        context.workload_manifest,
    )
    server, base_url = start_healthy_server(
        plan, group_name, server_paths, context.client.health_timeout_s
    )
    try:
        write_json(
            server_dir / "server.json",
            {
                "launch": server.plan.record(),
                "environment_in_force": recorded_environment(server.environment),
                "server_info": read_server_info(base_url),
                "started_at": now_iso(),
                "host_lock": lock_record,
                "provenance": context.traced_to[variant_name],
            },
        )
    except BaseException:
        server.stop()
        raise
    return server, base_url


def measure_cell(context: MapContext, server, base_url: str, arm: Arm) -> dict:
    """Put the cell's quota in force on the live server, then one measured window."""
    paths = RunPaths.in_directory(
        cell_directory(context, arm.variant, arm.intra_op_threads, arm.cpu_quota)
    )
    started_at = now_iso()
    started = time.monotonic()
    # The server's plan, with the cell's quota: what the cell's checks expect.
    quota = dataclasses.replace(server.plan.quota, cores=arm.cpu_quota)
    plan = dataclasses.replace(server.plan, quota=quota)
    server.quota_cores = arm.cpu_quota
    server.apply_quota()
    try:
        server_info = read_server_info(base_url)
        window, _ = measure(
            base_url,
            server,
            arm,
            plan.served_model_name,
            context.workload_manifest,
            context.client,
            context.monitors,
            paths,
            block=context.block,
        )
        if server.exit_code() is not None:
            raise ArmFailed(f"server exited with code {server.exit_code()}")
        identity = server_identity(plan, server_info, server)
        checks = validity_checks(
            plan, context.client, server_info, window, server, identity
        )
        write_json(paths.monitors, window)
        metrics = summarize_run(paths.requests, paths.monitors, arm, checks, run=1)
    except (ArmFailed, OSError) as failure:
        log.error("cell %s failed: %s", arm.name, failure)
        metrics = failed_run_metrics(arm, 1, str(failure).splitlines()[0])
    metrics.update(
        intra_op_threads=arm.intra_op_threads,
        cpu_quota=quota_label(arm.cpu_quota),
        started_at=started_at,
        wall_s=round(time.monotonic() - started, 3),
    )
    log.info(
        "block %d cell %s: valid=%s throughput=%s req/s",
        context.block,
        arm.name,
        metrics.get("valid"),
        metrics.get("throughput_rps"),
    )
    return metrics


def failed_cell(arm: Arm, reason: str) -> dict:
    metrics = failed_run_metrics(arm, 1, reason)
    metrics.update(
        intra_op_threads=arm.intra_op_threads, cpu_quota=quota_label(arm.cpu_quota)
    )
    return metrics


def map_table(blocks: list[list[dict]]) -> pd.DataFrame:
    """One line per cell and block, in the order they ran: the map's figures,
    invalid cells with their reason."""
    lines = []
    for cells in blocks:
        for cell in cells:
            line = {
                "block": int(cell["block"]),
                "position": int(cell["position"]),
                "variant": cell["variant"],
                "intra_op_threads": int(cell["intra_op_threads"]),
                "cpu_quota": str(cell["cpu_quota"]),
                "valid": bool(cell.get("valid")),
                "invalid_reason": "; ".join(cell.get("invalid_reasons") or []),
            }
            for figure in CELL_FIGURES:
                value = cell.get(figure)
                line[figure] = None if value is None or not line["valid"] else value
            lines.append(line)
    return pd.DataFrame(lines, columns=list(TABLE_COLUMNS))
