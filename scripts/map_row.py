"""Snakemake shim: one row of the thread x quota map on one fresh server."""

import json
import logging
import sys
from pathlib import Path

from serving_study.config.records import (
    ClientSettings,
    HostSharing,
    MonitorSettings,
    ServerSettings,
    Variant,
)
from serving_study.studies.thread_quota_map import run_map_row

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(
    stream=sys.stderr,
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(message)s",
)

cells = run_map_row(
    experiment=snakemake.wildcards.experiment,
    settings=dict(snakemake.params.settings),
    threads=int(snakemake.wildcards.threads),
    variant=Variant.from_identity(
        json.loads(Path(snakemake.input.variant).read_text())
    ),
    workload_manifest=Path(snakemake.input.workload),
    server_settings=ServerSettings.from_config(snakemake.params.server),
    client=ClientSettings.from_config(snakemake.params.client),
    monitors=MonitorSettings.from_config(snakemake.params.monitors),
    sharing=HostSharing.from_config(snakemake.params.sharing),
    cells_dir=Path(snakemake.output.cells),
)
Path(snakemake.output.row).write_text(json.dumps(cells, indent=2, default=str) + "\n")
