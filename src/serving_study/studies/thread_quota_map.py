"""Throughput over intra-op threads x CPU quota: where the copy's fan-out hurts.

The study measured one point (128 threads under 13.6 cores). The map measures a
grid for each copy variant: rows are forced intra-op thread counts, columns CPU
quotas (``none`` = no quota). Each row is one fresh server whose main process
is given its thread count with ``torch.set_num_threads`` (``OMP_NUM_THREADS``
cannot exceed the visible CPUs: torch clamps it). Within a row the quota is
rewritten on the live cgroup between cells, as ``docker update --cpus`` does,
and every cell gets its own warm-up and measured window, monitors and checks.
One server per row instead of per cell keeps a 96-cell map affordable; the
thread count, the one thing a restart would reset, is fixed per row.

A cell that cannot be measured is recorded as invalid with its reason; after
the server died, the row's remaining cells say so. Nothing invalid is drawn.
"""

import dataclasses
import logging
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
from serving_study.measure.host_sharing import MeasurementLock
from serving_study.measure.run_failure import ArmFailed, termination_as_interrupt
from serving_study.measure.run_metrics import failed_run_metrics, summarize_run
from serving_study.measure.run_outputs import RunPaths, now_iso, write_json
from serving_study.measure.run_window import measure
from serving_study.measure.server_checks import server_identity, validity_checks
from serving_study.measure.server_queries import read_server_info
from serving_study.measure.server_start import start_healthy_server
from serving_study.servers.environment import recorded_environment
from serving_study.servers.leftovers import owned_name

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
TABLE_COLUMNS = (
    "variant",
    "intra_op_threads",
    "cpu_quota",
    "valid",
    *CELL_FIGURES,
    "invalid_reason",
)


def quota_label(quota: float | str | None) -> str:
    """A quota as a directory name and a table value: ``2``, ``1.5`` or ``none``
    (from the config's value or an arm's cores)."""
    cores = quota_cores(quota)
    return "none" if cores is None else f"{cores:g}"


def map_rows(settings: Mapping) -> list[tuple[str, int]]:
    """Every (variant, intra-op threads) row of the map."""
    return [
        (variant, threads)
        for variant in settings["variants"]
        for threads in settings["intra_op_threads"]
    ]


def cell_arm(settings: Mapping, variant: str, threads: int, quota) -> Arm:
    """One cell as an arm, so that the arm runner's parts serve it: the map's
    settings, the row's variant and threads, the column's quota on the whole
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


@termination_as_interrupt()
def run_map_row(
    *,
    experiment: str,
    settings: Mapping,
    threads: int,
    variant: Variant,
    workload_manifest: Path,
    server_settings: ServerSettings,
    client: ClientSettings,
    monitors: MonitorSettings,
    cells_dir: Path,
    sharing: HostSharing,
) -> list[dict]:
    """Measure one row of the map on one server; return its cells' metrics.

    ``settings`` is the config's ``thread_quota_map`` section (what a row reads of
    it: workload, transport, quotas and the cells' sizes). The row holds the host's
    measurement lock from before its server starts until it has stopped, as an arm's
    run does.
    """
    with MeasurementLock.acquire(
        sharing, holder=f"experiment {experiment}, map row {variant.name} t{threads}"
    ) as lock:
        variant_name = variant.name
        quotas = settings["cpu_quotas"]
        cell_client = dataclasses.replace(
            client, warmup_requests=settings["warmup_requests"]
        )
        cells_dir.mkdir(parents=True, exist_ok=True)
        server_paths = RunPaths.in_directory(cells_dir)
        server_paths.server_log.write_text("")
        group_name = owned_name(f"{experiment}-map-{variant_name}-t{threads}")
        try:
            # On failure it has stopped its server already: nothing to tear down here.
            server, base_url = start_healthy_server(
                server_settings,
                variant,
                cell_arm(settings, variant_name, threads, quotas[0]),
                group_name,
                server_paths,
                cell_client,
                workload_manifest,
            )
        except ArmFailed as failure:
            reason = f"the row's server never served: {str(failure).splitlines()[0]}"
            return [
                failed_cell(settings, variant_name, threads, quota, reason)
                for quota in quotas
            ]
        cells: list[dict] = []
        try:
            write_json(
                cells_dir / "server.json",
                {
                    "server_argv": server.argv,
                    "environment_in_force": recorded_environment(server.environment),
                    "server_info": read_server_info(base_url),
                    "started_at": now_iso(),
                    "host_lock": lock.record,
                },
            )
            for quota in quotas:
                if server.exit_code() is not None:
                    reason = f"the row's server had exited (code {server.exit_code()})"
                    cells.append(
                        failed_cell(settings, variant_name, threads, quota, reason)
                    )
                    continue
                cells.append(
                    measure_cell(
                        server,
                        base_url,
                        cell_arm(settings, variant_name, threads, quota),
                        server_settings,
                        variant,
                        workload_manifest,
                        cell_client,
                        monitors,
                        cells_dir / f"quota-{quota_label(quota)}",
                    )
                )
        finally:
            server.stop()
        return cells


def measure_cell(
    server,
    base_url: str,
    arm: Arm,
    server_settings: ServerSettings,
    variant: Variant,
    workload_manifest: Path,
    client: ClientSettings,
    monitors: MonitorSettings,
    cell_dir: Path,
) -> dict:
    """Put the cell's quota in force on the live server, then one measured window."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    paths = RunPaths.in_directory(cell_dir)
    started = time.monotonic()
    server.quota_cores = arm.cpu_quota
    server.apply_quota()
    try:
        server_info = read_server_info(base_url)
        window, load_summary = measure(
            base_url,
            server,
            arm,
            server_settings,
            workload_manifest,
            client,
            monitors,
            paths,
        )
        if server.exit_code() is not None:
            raise ArmFailed(f"server exited with code {server.exit_code()}")
        identity = server_identity(server_settings, arm, variant, server_info, server)
        checks = validity_checks(arm, client, server_info, window, server, identity)
        write_json(paths.monitors, window)
        metrics = summarize_run(paths.requests, paths.monitors, arm, checks, run=1)
    except (ArmFailed, OSError) as failure:
        log.error("cell %s failed: %s", arm.name, failure)
        metrics = failed_run_metrics(arm, 1, str(failure).splitlines()[0])
    metrics.update(
        intra_op_threads=arm.intra_op_threads,
        cpu_quota=quota_label(arm.cpu_quota),
        wall_s=round(time.monotonic() - started, 3),
    )
    write_json(paths.metrics, metrics)
    log.info(
        "cell %s: valid=%s throughput=%s req/s",
        arm.name,
        metrics.get("valid"),
        metrics.get("throughput_rps"),
    )
    return metrics


def failed_cell(settings: Mapping, variant: str, threads: int, quota, reason: str):
    arm = cell_arm(settings, variant, threads, quota)
    metrics = failed_run_metrics(arm, 1, reason)
    metrics.update(intra_op_threads=threads, cpu_quota=quota_label(quota))
    return metrics


def map_table(rows: list[list[dict]]) -> pd.DataFrame:
    """One line per cell: the map's figures, invalid cells with their reason."""
    lines = []
    for cells in rows:
        for cell in cells:
            line = {
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
