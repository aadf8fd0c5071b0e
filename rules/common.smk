# Helpers shared by every stage: the checked config, lookups by name, wildcard
# constraints, the seeded order of the arms, and the lists of files each stage needs.
# No rules live here.
import re
import sys
from pathlib import Path

PROJECT_ROOT = Path(workflow.basedir)
sys.path.insert(0, str(PROJECT_ROOT / "src"))

from serving_study.arm_order import priority
from serving_study.config import ConfigError, check_config
from serving_study.sglang_commands import model_directory_name

try:
    check_config(
        config,
        schema_path=PROJECT_ROOT / "config" / "config.schema.yaml",
        config_files=workflow.configfiles,
        project_root=PROJECT_ROOT,
    )
except ConfigError as error:
    sys.exit(f"Config error (nothing was run):\n{error}")


# A measurement owns the host: Snakemake caps a job's threads at --cores, so asking
# for more than any host has keeps every other job off the machine during an arm.
WHOLE_HOST = 4096

EXPERIMENT = config["experiment"]
SOURCES = {source["name"]: source for source in config["sources"]}
VARIANTS = {variant["name"]: variant for variant in config["variants"]}
WORKLOADS = {workload["name"]: workload for workload in config["workloads"]}
ARMS = {arm["name"]: arm for arm in config["arms"]}
# The model a real SGLang server loads, as a file name (resources/models/<name>/).
MODEL = model_directory_name(config["sglang"]["model"])


def one_of(names):
    return "|".join(re.escape(name) for name in names)


wildcard_constraints:
    experiment=re.escape(EXPERIMENT),
    source=one_of(SOURCES),
    variant=one_of(VARIANTS),
    workload=one_of(WORKLOADS),
    arm=one_of(ARMS),
    run=r"[1-9][0-9]*",
    model=re.escape(MODEL),


def arm_runs():
    """Every (arm, run) of the experiment, runs numbered from 1."""
    return [
        (name, run) for name, arm in ARMS.items() for run in range(1, arm["runs"] + 1)
    ]


def run_directory(arm, run):
    return f"results/{EXPERIMENT}/{arm}/run{run}"


def run_metrics_files():
    return [f"{run_directory(arm, run)}/metrics.json" for arm, run in arm_runs()]


def arm_run_priority(wildcards):
    """Run blocks in order, each block's arms shuffled by the seed (arm_order.py)."""
    arm_runs = {name: arm["runs"] for name, arm in ARMS.items()}
    return priority(arm_runs, config["seed"], wildcards.arm, int(wildcards.run))


def source_of_variant(wildcards):
    source = VARIANTS[wildcards.variant]["source"]
    return f"resources/sources/{source}/identity.json"


def patch_of_variant(wildcards):
    patch = VARIANTS[wildcards.variant].get("patch")
    return [str(PROJECT_ROOT / patch)] if patch else []


def variant_of_arm(wildcards):
    return f"results/variants/{ARMS[wildcards.arm]['variant']}.json"


def workload_of_arm(wildcards):
    return f"results/workloads/{ARMS[wildcards.arm]['workload']}/manifest.json"


def engine_settings():
    """What the arm runner needs to start a server of the configured engine."""
    return {
        "engine": config["engine"],
        "runtime": config["runtime"],
        "embedded": config["embedded_engine"],
        "sglang": config["sglang"],
    }


def variant_identity_files():
    return [f"results/variants/{name}.json" for name in VARIANTS]


def final_outputs():
    return [
        f"results/{EXPERIMENT}/report.html",
        f"results/{EXPERIMENT}/tables/arms.csv",
    ]


def launch_commands_files():
    """Every arm's SGLang server and container command (engine sglang)."""
    return [f"results/{EXPERIMENT}/commands/{arm}.json" for arm in ARMS]


def model_snapshot_file():
    """The checked model snapshot's record; a real SGLang arm needs it."""
    return f"resources/models/{MODEL}/snapshot.json"
