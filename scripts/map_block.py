"""Snakemake shim: one block of the thread x quota map, every cell once."""

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
from serving_study.measure.run_provenance import run_provenance
from serving_study.studies.thread_quota_map import MapContext, run_map_block

sys.stderr = open(snakemake.log[0], "w")
logging.basicConfig(
    stream=sys.stderr,
    level=logging.INFO,
    format="%(asctime)s %(levelname)s %(message)s",
)

identities = [json.loads(Path(path).read_text()) for path in snakemake.input.variants]
variants = [Variant.from_identity(identity) for identity in identities]
host = json.loads(Path(snakemake.input.host).read_text())
cells = run_map_block(
    MapContext(
        experiment=snakemake.wildcards.experiment,
        settings=dict(snakemake.params.settings),
        block=int(snakemake.wildcards.block),
        variants={variant.name: variant for variant in variants},
        workload_manifest=Path(snakemake.input.workload),
        server_settings=ServerSettings.from_config(snakemake.params.server),
        client=ClientSettings.from_config(snakemake.params.client),
        monitors=MonitorSettings.from_config(snakemake.params.monitors),
        block_dir=Path(snakemake.output.cells),
        traced_to={
            variant.name: run_provenance(snakemake.config, host, identity)
            for variant, identity in zip(variants, identities, strict=True)
        },
    ),
    seed=int(snakemake.params.seed),
    sharing=HostSharing.from_config(snakemake.config["host_sharing"]),
)
Path(snakemake.output.block).write_text(json.dumps(cells, indent=2, default=str) + "\n")
