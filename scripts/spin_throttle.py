"""Snakemake shim: measure the OpenMP workers' spin per pool size; write JSON."""

import json
import sys
from pathlib import Path

from serving_study.config.records import HostSharing
from serving_study.measure.host_sharing import MeasurementLock
from serving_study.measure.run_provenance import project_commit
from serving_study.studies.spin_throttle import (
    SpinThrottleSettings,
    measure_spin_throttle,
)

sys.stderr = open(snakemake.log[0], "w")

# The host's measurement lock: its spinning workers would disturb another
# pipeline's runs.
sharing = HostSharing.from_config(snakemake.config["host_sharing"])
with MeasurementLock.acquire(sharing, "spin throttle measurement"):
    figures = measure_spin_throttle(
        SpinThrottleSettings.from_config(snakemake.params.settings)
    )
figures["project"] = project_commit()
Path(snakemake.output.figures).write_text(json.dumps(figures, indent=2) + "\n")
