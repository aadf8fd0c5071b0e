# Helpers shared by every stage: the checked config and its records, lookups by name,
# wildcard constraints, the seeded order of the arms, and the lists of files each
# stage needs. No rules live here.
import os
import re
import sys
from pathlib import Path

PROJECT_ROOT = Path(workflow.basedir)
sys.path.insert(0, str(PROJECT_ROOT / "src"))
# Each job's Python finds this package in src/ too, installed or not: a rule's conda
# environment (envs/workflow.yaml) then needs only the third-party packages.
os.environ.update(
    PYTHONPATH=os.pathsep.join(
        [str(PROJECT_ROOT / "src"), *filter(None, [os.getenv("PYTHONPATH")])]
    )
)

from serving_study.config.arm_order import priority
from serving_study.config.content_keys import content_key
from serving_study.config.crosscheck_settings import ClientCrosscheck
from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    ServerSettings,
    Workload,
)
from serving_study.config.validation import ConfigError, check_config
from serving_study.launch.sglang import model_folder_name, model_source
from serving_study.servers.container_commands import RUNTIMES as CONTAINER_RUNTIMES
from serving_study.config.platform import (
    CPU_RUNTIME_RECORD,
    GPU_STAND_IN_DIRECTORY,
    HOST_TORCH_RUNTIME_LOCK,
    HOST_TORCH_RUNTIME_RECORD,
)
from serving_study.sources.tiny_model_settings import TinyModelSettings

try:
    check_config(
        config,
        schema_path=PROJECT_ROOT / "config" / "schema" / "config.schema.yaml",
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
# What a checkout shares between experiments is named by its record's hash as well as
# its name (content_keys.py): another experiment that gives a source another record
# fetches it into another folder, and never rewrites what this one's runs read.
SOURCE_KEYS = {name: content_key(name, record) for name, record in SOURCES.items()}
SOURCE_RECORDS = {SOURCE_KEYS[name]: record for name, record in SOURCES.items()}
VARIANTS = {variant["name"]: variant for variant in config["variants"]}
# The checked config as records (config/records.py). A rule passes a job a record's
# as_config(), which holds only what the job uses: Snakemake reruns a job whose
# params changed, and a key the job does not read must never rerun it.
WORKLOADS = {
    workload["name"]: Workload.from_config(workload) for workload in config["workloads"]
}
ARMS = {arm["name"]: Arm.from_config(arm) for arm in config["arms"]}
RUNS = {arm["name"]: arm["runs"] for arm in config["arms"]}
SERVER = ServerSettings.from_config(config)
CLIENT = ClientSettings.from_config(config["client"])
MONITORS = MonitorSettings.from_config(config["monitors"])
HOST_SHARING = HostSharing.from_config(config["host_sharing"])
# Where a real SGLang server runs (decided once, in SERVER: config/platform.py lists
# what follows from it), and the model it loads, as a file name under resources/.
SGLANG_PLATFORM = SERVER.platform
TINY_MODEL = (
    TinyModelSettings.from_config(config["sglang"]["tiny_model"])
    if "tiny_model" in config["sglang"]
    else None
)

# The tiny model's name holds its settings' digest; a Hub model's folder its id's
# and its source's (id, revision, local path).
MODEL = TINY_MODEL.directory_name if TINY_MODEL else model_folder_name(config["sglang"])


def one_of(names):
    return "|".join(re.escape(name) for name in names)


wildcard_constraints:
    experiment=re.escape(EXPERIMENT),
    source=one_of(SOURCE_RECORDS),
    variant=one_of(VARIANTS),
    workload=one_of(WORKLOADS),
    arm=one_of(ARMS),
    run=r"[1-9][0-9]*",
    block=r"[1-9][0-9]*",
    model=re.escape(MODEL),


def arm_runs():
    """Every (arm, run) of the experiment, runs numbered from 1."""
    return [(name, run) for name, runs in RUNS.items() for run in range(1, runs + 1)]


def run_directory(arm, run):
    return f"results/{EXPERIMENT}/{arm}/run{run}"


def run_metrics_files():
    return [f"{run_directory(arm, run)}/metrics.json" for arm, run in arm_runs()]


def run_attempts_files():
    """Every run's attempts.json (its earlier attempts too), in run_metrics_files'
    order."""
    return [f"{run_directory(arm, run)}/attempts.json" for arm, run in arm_runs()]


def run_provenance_files():
    """Every run's provenance.json (its node among it), in run_metrics_files'
    order."""
    return [f"{run_directory(arm, run)}/provenance.json" for arm, run in arm_runs()]


def run_files(name):
    """Every run's file ``name`` (requests.jsonl, monitors.json), in
    run_metrics_files' order."""
    return [f"{run_directory(arm, run)}/{name}" for arm, run in arm_runs()]


# Everything an arm needs is made before the first arm runs. The run_arm
# priorities put the measurement in shuffled blocks (arm_order.py), but Snakemake
# runs the highest-priority job that is ready: a preparation job left at priority
# 0 (the second variant's tree, say) would let every arm of the first variant run
# before it, one variant after the other.
PREPARATION_PRIORITY = 1_000_000


def arm_run_priority(wildcards):
    """Run blocks in order, each block's arms shuffled by the seed (arm_order.py)."""
    return priority(RUNS, config["seed"], wildcards.arm, int(wildcards.run))


def source_directory(name):
    """Where source ``name`` is fetched (shared by experiments with its record)."""
    return f"resources/sources/{SOURCE_KEYS[name]}"


def source_of_variant(wildcards):
    """The fetched source a variant is laid out from: its identity and its tree."""
    directory = source_directory(VARIANTS[wildcards.variant]["source"])
    return {"source": f"{directory}/identity.json", "source_tree": f"{directory}/tree"}


def patch_file(variant):
    """The variant's patch file, as a list (empty without a patch)."""
    patch = VARIANTS[variant].get("patch")
    return [str(PROJECT_ROOT / patch)] if patch else []


def patch_of_variant(wildcards):
    return patch_file(wildcards.variant)


def patch_of_arm(wildcards):
    """The patch of the arm's variant when a real SGLang server runs it: its plan
    names the modules it changes, which the server must report as loaded."""
    return patch_file(ARMS[wildcards.arm].variant) if SERVER.engine == "sglang" else []


def variant_record(wildcards):
    """The variant's config record, less its free-text description."""
    variant = VARIANTS[wildcards.variant]
    return {key: value for key, value in variant.items() if key != "description"}


# An experiment's variants, workloads and images are its own: another experiment in
# the same checkout that reuses a name with other settings cannot touch them.
def variant_file(name):
    return f"results/{EXPERIMENT}/variants/{name}.json"


def workload_file(name):
    return f"results/{EXPERIMENT}/workloads/{name}/manifest.json"


def image_file(variant):
    return f"results/{EXPERIMENT}/images/{variant}.iid"


def variant_of_arm(wildcards):
    return variant_file(ARMS[wildcards.arm].variant)


def workload_of_arm(wildcards):
    return workload_file(ARMS[wildcards.arm].workload)


def arm_settings(wildcards):
    """The arm's settings as plain config values (Arm.as_config)."""
    return ARMS[wildcards.arm].as_config()


# What the tables read of the config (analysis/), and what the report reads besides:
# its title and, for real SGLang, where the server ran (report/).
ANALYSIS_KEYS = (
    "arms",
    "variants",
    "sources",
    "reference",
    "claims",
    "fixes",
    "release_series",
    "change_criterion",
)
REPORT_KEYS = (*ANALYSIS_KEYS, "experiment", "description", "engine", "runtime")


def config_part(keys):
    return {key: config[key] for key in keys if key in config}


def report_config():
    """What the report reads of the config (REPORT_KEYS; for real SGLang where the
    server ran and the model it served)."""
    part = config_part(REPORT_KEYS)
    if SERVER.engine == "sglang":
        part["sglang"] = {"device": SERVER.device, "torch": SERVER.torch}
        if "tiny_model" in config["sglang"]:
            part["sglang"]["tiny_model"] = config["sglang"]["tiny_model"]
    if SERVER.container is not None:
        part["container"] = dict(SERVER.container)
    if SERVER.engine == "embedded":
        timing = ("prefill_ms_per_image", "decode_step_ms")
        part["embedded_engine"] = {key: SERVER.embedded[key] for key in timing}
    return part


def variant_identity_files():
    return [variant_file(name) for name in VARIANTS]


def map_block_files():
    """Each block of the thread x quota map (none when the config has no map)."""
    settings = config.get("thread_quota_map")
    if not settings:
        return []
    return [
        f"results/{EXPERIMENT}/thread-quota-map/block{block}.json"
        for block in range(1, settings["blocks"] + 1)
    ]


def map_table_files():
    """The map's tables, which the report draws, when the config has a map."""
    if not config.get("thread_quota_map"):
        return []
    return [
        f"results/{EXPERIMENT}/tables/thread_quota_map.csv",
        f"results/{EXPERIMENT}/tables/thread_quota_map_contrast.csv",
        f"results/{EXPERIMENT}/tables/thread_quota_map_by_quota.csv",
    ]


def final_outputs():
    # The cross-check's tables too: a report made before the config asked for it
    # is then older than its new input, and is made again.
    return [
        f"results/{EXPERIMENT}/report.html",
        f"results/{EXPERIMENT}/tables/arms.csv",
        *crosscheck_table_files(),
    ]


def launch_plan_file(arm):
    return f"results/{EXPERIMENT}/commands/{arm}.json"


def launch_plan_of_arm(wildcards):
    return launch_plan_file(wildcards.arm)


def launch_plan_files():
    """Every arm's launch plan (rule launch_plan)."""
    return [launch_plan_file(arm) for arm in ARMS]


def model_snapshot_file():
    """The model's record (rule model, or rule tiny_model); a real SGLang arm
    needs it."""
    if TINY_MODEL:
        return f"resources/tiny-models/{MODEL}/snapshot.json"
    return f"resources/models/{MODEL}/snapshot.json"


def model_of_engine(wildcards):
    """The model snapshot record when the arms run real SGLang servers."""
    return [model_snapshot_file()] if config["engine"] == "sglang" else []


# The CPU runtime's record (rules that always measure on CPU name it directly).
SGLANG_RUNTIME = CPU_RUNTIME_RECORD


def sglang_runtime_of_engine(wildcards):
    """The record of the server runtime the workflow builds, when a local SGLang
    server runs in one (on CPU, or with the host's torch: rules/runtime.smk)."""
    builds = SGLANG_PLATFORM and SGLANG_PLATFORM.builds_runtime
    return [SGLANG_PLATFORM.runtime_record] if builds and not in_containers() else []


def host_torch_stand_in_files():
    """The stand-ins a server with the host's torch imports (config/platform.py)."""
    directory = PROJECT_ROOT / GPU_STAND_IN_DIRECTORY
    return sorted(
        str(path) for path in directory.rglob("*.py") if "__pycache__" not in path.parts
    )


def tiny_model_directory():
    """Where rule tiny_model writes the tiny model (None without one)."""
    return f"resources/tiny-models/{MODEL}/model" if TINY_MODEL else None


def model_download_directory():
    """Where the model rule downloads the model when config names no local path."""
    return f"resources/models/{MODEL}/snapshot"


# --- Container images (runtime docker or podman) -----------------------------------


def in_containers():
    """Arms run as containers, each from its variant's image (rules/images.smk)."""
    return config["runtime"] in CONTAINER_RUNTIMES


def project_file(relative):
    """A file of the project itself (not of the working directory), as an input."""
    return str(PROJECT_ROOT / relative)


def image_of_arm(wildcards):
    """The image id file of the arm's variant when arms run in containers."""
    if not in_containers():
        return []
    return image_file(ARMS[wildcards.arm].variant)


def package_files_of_engine():
    """The serving_study sources an embedded image holds: a change rebuilds it."""
    if config["engine"] != "embedded":
        return []
    package = PROJECT_ROOT / "src" / "serving_study"
    return sorted(str(path) for path in package.rglob("*.py"))


def published_results():
    """The results pages' folder, whose docs/results/*/tables/fixes.csv the
    preflight doctor quotes when it prescribes a fix: the folder, not its tables,
    so that a page added to it is no new input of any job (none where there is no
    such folder)."""
    return ["docs/results"] if Path("docs/results").is_dir() else []


# --- Our client against bench_serving (rules/crosscheck.smk) -----------------------

CROSSCHECK = (
    ClientCrosscheck.from_config(config["client_crosscheck"])
    if config.get("client_crosscheck")
    else None
)


def crosscheck_table_files():
    """The cross-check's tables, which the report shows, when the config asks."""
    if CROSSCHECK is None:
        return []
    return [
        f"results/{EXPERIMENT}/tables/client_crosscheck.csv",
        f"results/{EXPERIMENT}/tables/client_crosscheck_runs.csv",
    ]


def crosscheck_tokenizer():
    """The model record whose folder holds bench_serving's tokenizer: the served
    model's, or with the embedded engine the default tiny Qwen3-VL's."""
    if SERVER.engine == "sglang":
        return model_snapshot_file()
    return f"results/{EXPERIMENT}/crosscheck/tokenizer/snapshot.json"


def release_of_arm(wildcards):
    """The fetched source the arm's variant is made from (bench_serving's)."""
    return source_directory(VARIANTS[ARMS[wildcards.arm].variant]["source"])
