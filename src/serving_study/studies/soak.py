"""Soak test: many real arms in one process, then a check that nothing leaked.

``python -m serving_study.studies.soak --runs 16`` runs every arm of an experiment
config (default: the embedded default) ``--runs`` times through the arm runner, in the
same seeded block order as the workflow, all inside this one process. A harness
that leaks shows it here: after the last run there must be no server process, no
cgroup of ours, no SGLang shared-memory segment, and no more file descriptors or
threads in this process than after the first run. Prints a JSON summary and exits
non-zero on any leak or on a run that failed.

It needs the variants and workloads of the config: build them first with
``snakemake --cores 1 all`` (or by naming their files as targets).
"""

import argparse
import dataclasses
import gc
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

from serving_study.config.arm_order import execution_order
from serving_study.config.platform import PROJECT_ROOT
from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    ServerSettings,
    Variant,
)
from serving_study.config.schema import SCHEMA_PATH
from serving_study.config.validation import check_config
from serving_study.launch.engines import launch_plan
from serving_study.measure.arm_runner import run_arm
from serving_study.measure.run_outputs import RunPaths

RESULTS = PROJECT_ROOT / "results"
SHARED_MEMORY = Path("/dev/shm")


def our_cgroups(experiment: str) -> list[str]:
    found = []
    for hierarchy in ("cpu", "cpuacct", "unified", ""):
        parent = Path("/sys/fs/cgroup") / hierarchy / "serving-study"
        if parent.is_dir():
            found += [str(p) for p in parent.iterdir() if p.name.startswith(experiment)]
    return sorted(set(found))


def leaked_segments() -> list[str]:
    """SGLang segments whose creator is gone."""
    return [
        path.name
        for path in SHARED_MEMORY.glob("sgl_shm_*")
        if not psutil.pid_exists(int(path.name.split("_")[-2]))
    ]


def process_state() -> dict:
    gc.collect()  # what only waits for the collector is not a leak
    me = psutil.Process()
    return {
        "open_files": me.num_fds(),
        "threads": threading.active_count(),
        "os_threads": me.num_threads(),
        "children": [child.pid for child in me.children(recursive=True)],
    }


def soak(config_path: Path, runs: int, requests: int | None, workdir: Path) -> dict:
    config = yaml.safe_load(config_path.read_text())
    check_config(config, SCHEMA_PATH, [config_path], PROJECT_ROOT)
    experiment = f"soak-{config['experiment']}"
    arms = {arm["name"]: Arm.from_config(arm) for arm in config["arms"]}
    order = execution_order({name: runs for name in arms}, config["seed"])
    server_settings = ServerSettings.from_config(config)
    client = ClientSettings.from_config(config["client"])
    monitors = MonitorSettings.from_config(config["monitors"])
    sharing = HostSharing.from_config(config["host_sharing"])
    started = time.monotonic()
    failures, baseline, throughputs = [], None, {name: [] for name in arms}
    for position, (arm_name, run) in enumerate(order, start=1):
        arm = arms[arm_name]
        if requests:
            arm = dataclasses.replace(arm, requests=requests)
        # The experiment's own variants and workloads, as its study made them.
        prepared = RESULTS / config["experiment"]
        identity = prepared / "variants" / f"{arm.variant}.json"
        variant = Variant.from_identity(json.loads(identity.read_text()))
        manifest = prepared / "workloads" / arm.workload / "manifest.json"
        directory = workdir / arm_name / f"run{run}"
        directory.mkdir(parents=True, exist_ok=True)
        metrics = run_arm(
            experiment=experiment,
            arm=arm,
            run=run,
            variant=variant,
            workload_manifest=manifest,
            plan=launch_plan(server_settings, arm, variant, manifest),
            client=client,
            monitors=monitors,
            sharing=sharing,
            paths=RunPaths.in_directory(directory),
        )
        if not metrics["valid"]:
            reasons = metrics["invalid_reasons"]
            failures.append({"arm": arm_name, "run": run, "reasons": reasons})
        throughputs[arm_name].append(metrics.get("throughput_rps"))
        state = process_state()
        baseline = baseline or state
        print(
            f"[{position}/{len(order)}] {arm_name} run {run}: valid={metrics['valid']} "
            f"{metrics.get('throughput_rps') or 0:.2f} req/s, "
            f"fds={state['open_files']}, threads={state['threads']}",
            file=sys.stderr,
            flush=True,
        )
    final = process_state()
    leaks = {
        "server_processes": final["children"],
        "cgroups": our_cgroups(experiment),
        "shared_memory_segments": leaked_segments(),
        "open_files_growth": final["open_files"] - baseline["open_files"],
        "threads_growth": final["threads"] - baseline["threads"],
    }
    leaked = (
        leaks["server_processes"]
        or leaks["cgroups"]
        or leaks["shared_memory_segments"]
        or leaks["open_files_growth"] > 0
        or leaks["threads_growth"] > 0
    )
    return {
        "config": str(config_path),
        "runs_per_arm": runs,
        "total_runs": len(order),
        "failed_runs": failures,
        "wall_s": round(time.monotonic() - started, 1),
        "throughput_rps_by_arm": throughputs,
        "process_after_first_run": baseline,
        "process_after_last_run": final,
        "leaks": leaks,
        "ok": not failures and not leaked,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", type=Path, default=PROJECT_ROOT / "config" / "config.yaml"
    )
    parser.add_argument(
        "--runs", type=int, default=16, help="runs per arm (default 16)"
    )
    parser.add_argument(
        "--requests", type=int, help="measured requests per run (default: the config's)"
    )
    arguments = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("the arms' CPU quota is a cgroup: run as root")
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="serving-study-soak-") as scratch:
        summary = soak(
            arguments.config, arguments.runs, arguments.requests, Path(scratch)
        )
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
