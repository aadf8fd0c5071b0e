"""Snakemake shim: build one variant's container image, write its id and record."""

import json
import logging
import os
import sys
from pathlib import Path

from serving_study.config.records import HostSharing
from serving_study.measure.host_sharing import preparation_lock
from serving_study.sources.images import build_variant_image

sys.stderr = open(snakemake.log.messages, "w")
logging.basicConfig(stream=sys.stderr, level=logging.INFO)


def package_directory(package_files):
    """The package's directory: the common parent of its source files (if any)."""
    files = [str(path) for path in package_files]
    return Path(os.path.commonpath(files)) if files else None


# From the config, not a param: how pipelines share the host re-runs no job.
sharing = HostSharing.from_config(snakemake.config["host_sharing"])
with preparation_lock(sharing, f"build_image of {snakemake.output.image_id}"):
    record = build_variant_image(
        runtime=snakemake.params.runtime,
        engine=snakemake.params.image_kind,
        variant=json.loads(Path(snakemake.input.variant).read_text()),
        settings=dict(snakemake.params.settings),
        dockerfile=Path(snakemake.input.dockerfile),
        verify_script=Path(snakemake.input.check),
        image_id_file=Path(snakemake.output.image_id),
        inspect_file=Path(snakemake.output.inspect),
        log_path=Path(snakemake.log.build),
        # The embedded engine's image holds our package; it and the CPU SGLang image
        # install a wheelhouse; the CPU SGLang image holds the platform's python-path
        # directories (load probe, sgl-kernel stand-in).
        package_directory=package_directory(snakemake.input.package),
        wheelhouse=Path(snakemake.input.wheelhouse)
        if snakemake.input.wheelhouse
        else None,
        python_path_directories=[
            Path(directory) for directory in snakemake.params.python_path_directories
        ],
    )
logging.info("built %s (%.0f MiB)", record["Id"], record["Size"] / 2**20)
