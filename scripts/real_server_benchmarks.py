"""Snakemake shim: the real server's start, overhead and main-process CPU split."""

import csv
import json
import logging
import sys
from pathlib import Path

from serving_study.analysis.real_server_figures import (
    arm_run_figures,
    split_of_main_cpu,
)
from serving_study.config.platform import CPU_PLATFORM, python_path
from serving_study.config.records import Arm, HostSharing
from serving_study.measure.host_sharing import MeasurementLock
from serving_study.studies.main_process_steps import measure_main_process_steps

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
log = logging.getLogger("real_server_benchmarks")

runtime = json.loads(Path(snakemake.input.runtime).read_text())
snapshot = json.loads(Path(snakemake.input.model).read_text())
variants = {
    json.loads(Path(path).read_text())["name"]: json.loads(Path(path).read_text())
    for path in snakemake.input.variants
}
# Each workload's manifest, by the workload's name (its directory).
manifests = {Path(path).parent.name: Path(path) for path in snakemake.input.workloads}
# From the config, not a param: how pipelines share the host re-runs no job.
sharing = HostSharing.from_config(snakemake.config["host_sharing"])
rows = []
for arm in map(Arm.from_config, snakemake.params.arms):
    name = arm.name
    runs = [
        Path(path).parent for path in snakemake.input.metrics if f"/{name}/run" in path
    ]
    figures = arm_run_figures(runs)
    manifest_path = manifests[arm.workload]
    manifest = json.loads(manifest_path.read_text())
    images = [
        manifest_path.parent / image["file"]
        for image in manifest["images"][: snakemake.params.images]
    ]
    log.info(
        "arm %s: measuring the main process's steps on %d images", name, len(images)
    )
    # Timed alone: never beside another pipeline's run or preparation.
    with MeasurementLock.acquire(sharing, f"real_server_benchmarks, arm {name}"):
        steps = measure_main_process_steps(
            runtime_python=runtime["python"],
            python_path=python_path(
                CPU_PLATFORM, variants[arm.variant]["sglang_python_root"]
            ),
            arm_environment=dict(arm.environment),
            model_directory=Path(snapshot["path"]),
            images=images,
        )
    split = split_of_main_cpu(figures, steps)
    rows.append({"arm": name, **figures, **split})

figures_path = Path(snakemake.output.figures)
figures_path.write_text(json.dumps(rows, indent=2) + "\n")
with open(snakemake.output.table, "w", newline="") as table:
    writer = csv.DictWriter(table, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
for row in rows:
    print(
        f"{row['arm']:>8}: start to healthy {row['start_to_healthy_s']:.1f} s, "
        f"arm overhead {row['arm_overhead_s']:.1f} s, main CPU "
        f"{row['main_cpu_ms_per_request']:.1f} ms/request = processor "
        f"{row['processor_cpu_ms']:.1f} + SHM copy {row['shm_copy_cpu_ms']:.1f} + "
        f"rest {row['rest_cpu_ms']:.1f} ms ({row['torch_threads']} intra-op threads); "
        f"scheduler {row['scheduler_cpu_ms_per_request']:.0f} ms/request",
        flush=True,
    )
