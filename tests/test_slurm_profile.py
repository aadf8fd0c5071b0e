"""The SLURM profile: what it asks SLURM for, which jobs leave the host, and a real run.

Without a cluster, Snakemake plans the smallest study and the GPU host's with
profiles/slurm through snakemake-executor-plugin-slurm, its parsed workflow says
which rules run where Snakemake runs, and the plugin's own reading of each job's
resources says how many CPUs it would ask SLURM for. With RUN_SLURM_TESTS=1 (root,
Debian), tests/slurm/run_study_on_slurm.sh starts a real one-node SLURM here and
runs the study through it.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from study_helpers import snakemake_command

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "slurm"
CONFIG = ROOT / "config" / "test" / "config.yaml"
RULES = ROOT / "rules"
PLUGIN = "snakemake-executor-plugin-slurm"
RUN_ON_SLURM = ROOT / "tests" / "slurm" / "run_study_on_slurm.sh"
# The rules whose jobs measure on the node they run on: each is a SLURM job.
MEASURING_RULES = {
    "preflight",
    "arm_preflight",
    "run_arm",
    "measure_harness",
    "bisect_commits",
    "map_block",
    "spin_throttle",
    "crosscheck_pair",
}
# Every rule that asks for a whole node; an image build measures nothing.
WHOLE_NODE_RULES = MEASURING_RULES | {"build_image"}


def plugin_installed() -> bool:
    shown = subprocess.run(
        [sys.executable, "-m", "pip", "show", "--quiet", PLUGIN],
        capture_output=True,
    )
    return shown.returncode == 0


needs_plugin = pytest.mark.skipif(
    not plugin_installed(),
    reason=f"{PLUGIN} is not installed: pip install -r requirements.txt",
)


def profile() -> dict:
    return yaml.safe_load((PROFILE / "profile.yaml").read_text())


def test_profile_submits_to_slurm_with_a_request_for_every_job():
    settings = profile()
    assert settings["executor"] == "slurm"
    assert {"slurm_partition", "runtime", "mem_mb"} <= set(
        settings["default-resources"]
    )
    requests = settings["set-resources"]
    assert set(requests) == WHOLE_NODE_RULES
    arm = requests["run_arm"]
    assert {"gpu", "cpus_per_task", "runtime", "mem_mb"} <= set(arm)
    assert "--exclusive" in arm["slurm_extra"]
    for rule in WHOLE_NODE_RULES:
        # Same node kind, same view of its CPUs (and GPU, where it measures) as an
        # arm's.
        shared = ("gpu", "cpus_per_task", "slurm_extra")
        for resource in shared if rule in MEASURING_RULES else shared[1:]:
            assert requests[rule][resource] == arm[resource], (rule, resource)


def rules_owning_the_host() -> dict[str, bool]:
    """Each rule in rules/*.smk that asks for `threads: WHOLE_HOST`, and whether
    it is a local rule."""
    owning = {}
    for path in sorted(RULES.glob("*.smk")):
        chunks = re.split(
            r"^\s*(?:rule|checkpoint) (\w+):$", path.read_text(), flags=re.M
        )
        for name, body in zip(chunks[1::2], chunks[2::2], strict=True):
            if re.search(r"^\s+threads: WHOLE_HOST$", body, re.M):
                owning[name] = bool(re.search(r"^\s+localrule: True$", body, re.M))
    return owning


def test_every_rule_owning_the_host_asks_slurm_for_one_node():
    owning = rules_owning_the_host()
    # A local rule runs where Snakemake runs and asks SLURM for nothing.
    slurm_jobs = {rule for rule, is_local in owning.items() if not is_local}
    assert slurm_jobs >= {"run_arm", "build_image", "map_block"}
    settings = profile()
    node_cpus = settings["set-resources"]["run_arm"]["cpus_per_task"]
    assert set(settings["set-threads"]) == slurm_jobs
    assert slurm_jobs <= set(settings["set-resources"])
    for rule in slurm_jobs:
        assert settings["set-threads"][rule] == node_cpus, rule
        assert settings["set-resources"][rule]["cpus_per_task"] == node_cpus, rule


def planned_jobs(workdir: Path, *arguments: str, config: Path = CONFIG) -> str:
    finished = subprocess.run(
        snakemake_command(
            workdir,
            "all",
            "--dry-run",
            "--workflow-profile",
            str(PROFILE),
            *arguments,
            config=config,
        ),
        capture_output=True,
        text=True,
        timeout=300,
        env={name: value for name, value in os.environ.items() if name != "SLURM_CONF"},
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    return finished.stdout


def job_resources(plan: str) -> dict[str, list[str]]:
    """Each planned rule's `resources:` lines, from a dry run's job listing."""
    resources: dict[str, list[str]] = {}
    for block in re.split(r"\n(?=rule )", plan):
        name = re.match(r"rule (\w+):", block)
        line = re.search(r"^\s+resources: (.*)$", block, re.M)
        if name and line:
            resources.setdefault(name.group(1), []).append(line.group(1))
    return resources


# Snakemake's dry run cannot say which jobs would leave the host (it leaves the
# executor out of its listing), so the rule flags come from its parsed workflow.
LOCAL_RULES_SCRIPT = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

root, config, workdir = map(Path, sys.argv[1:4])
with SnakemakeApi(OutputSettings()) as api:
    workflow = api.workflow(
        resource_settings=ResourceSettings(),
        config_settings=ConfigSettings(configfiles=[config]),
        snakefile=root / "Snakefile",
        workdir=workdir,
    )._workflow
    local = {
        rule.name: rule.name in workflow._localrules or rule.norun
        for rule in workflow.rules
    }
print("LOCAL_RULES " + json.dumps(local))
"""


def rules_run_where_snakemake_runs(
    workdir: Path, config: Path = CONFIG
) -> dict[str, bool]:
    finished = subprocess.run(
        [sys.executable, "-c", LOCAL_RULES_SCRIPT, str(ROOT), str(config), workdir],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    line = finished.stdout.strip().splitlines()[-1]
    return json.loads(line.removeprefix("LOCAL_RULES "))


@needs_plugin
def test_only_preflight_and_arms_of_the_study_are_slurm_jobs(tmp_path):
    plan = planned_jobs(tmp_path)
    stats = re.search(r"Job stats:\n(.*?)\ntotal", plan, re.S).group(1)
    planned = dict(re.findall(r"^(\w+)\s+(\d+)$", stats, re.M))
    assert planned["run_arm"] == "2" and planned["preflight"] == "1"
    assert planned["arm_preflight"] == "2"

    local = rules_run_where_snakemake_runs(tmp_path)
    slurm_jobs = {rule for rule in planned if not local[rule]}
    assert slurm_jobs == {"preflight", "arm_preflight", "run_arm"}
    # Every rule that measures leaves the host; nothing else does but image builds
    # (a container image lives on the node that runs it).
    assert {rule for rule, is_local in local.items() if not is_local} == {
        *(MEASURING_RULES & set(local)),
        "build_image",
    }

    # The plugin read the profile: the arm and preflight jobs carry its requests.
    resources = job_resources(plan)
    for rule in ("run_arm", "preflight", "arm_preflight"):
        for line in resources[rule]:
            assert "slurm_partition=gpu" in line and "gpu=1" in line, line
            assert "cpus_per_task=64" in line and "slurm_extra=--exclusive" in line


# A SLURM run has no --cores, so nothing caps a job's threads; a dry run caps them
# at --cores (1 unless given), so it plans with more cores than any rule asks for.
UNCAPPED_CORES = str(10**6)


def slurm_cpu_requests(plan: str, local: dict[str, bool]) -> list[tuple[str, int, int]]:
    """(rule, threads, CPUs) of each planned SLURM job: its threads, and the CPUs
    the plugin asks sbatch for (--cpus-per-task, or --cpus-per-gpu times its GPUs),
    read from its threads and resources by the plugin's own function."""
    from snakemake_executor_plugin_slurm.partitions import get_job_cpu_requirement

    requests = []
    for block in re.split(r"\n(?=rule )", plan):
        name = re.match(r"rule (\w+):", block)
        if not name or local[name.group(1)]:
            continue
        threads_line = re.search(r"^\s+threads: (\d+)$", block, re.M)
        threads = int(threads_line.group(1)) if threads_line else 1
        line = re.search(r"^\s+resources: (.*)$", block, re.M).group(1)
        resources = dict(item.split("=", 1) for item in line.split(", "))
        cpus, per = get_job_cpu_requirement(
            SimpleNamespace(threads=threads, resources=resources)
        )
        if per == "gpu":
            cpus *= int(resources["gpu"])
        requests.append((name.group(1), threads, cpus))
    return requests


@needs_plugin
@pytest.mark.parametrize(
    ("config", "whole_node_rules"),
    [
        ("gpu-host.yaml", {"preflight", "arm_preflight", "run_arm", "map_block"}),
        ("b1.yaml", {"preflight", "arm_preflight", "run_arm", "build_image"}),
    ],
)
def test_no_slurm_job_asks_for_more_cpus_than_a_node_has(
    tmp_path, config, whole_node_rules
):
    config = ROOT / "config" / config
    plan = planned_jobs(tmp_path, "--cores", UNCAPPED_CORES, config=config)
    local = rules_run_where_snakemake_runs(tmp_path, config)
    requests = slurm_cpu_requests(plan, local)
    node_cpus = profile()["set-resources"]["run_arm"]["cpus_per_task"]
    assert {rule for rule, _, _ in requests} == whole_node_rules
    too_large = sorted(
        {
            (rule, threads, cpus)
            for rule, threads, cpus in requests
            if max(threads, cpus) > node_cpus
        }
    )
    assert too_large == [], f"(rule, threads, CPUs) over a node's {node_cpus} CPUs"
    # The rules that own the host get the whole node, not a share of it.
    assert {cpus for _, _, cpus in requests} == {node_cpus}


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("RUN_SLURM_TESTS") != "1",
    reason=f"a real SLURM run (root, apt, ~3 min): RUN_SLURM_TESTS=1 or {RUN_ON_SLURM}",
)
def test_study_runs_on_a_real_slurm(tmp_path):
    finished = subprocess.run(
        [str(RUN_ON_SLURM)],
        capture_output=True,
        text=True,
        timeout=1200,
        env=os.environ | {"PYTHON": sys.executable, "SLURM_STUDY_DIR": str(tmp_path)},
    )
    output = finished.stdout + finished.stderr
    assert finished.returncode == 0, output[-6000:]
    print(output)  # the SLURM jobs and sacct's records, shown with -s or -rA
    assert "SLURM run check passed" in finished.stdout
