"""Each job's params hold only what the job uses.

Snakemake reruns a job whose params differ from those of its last run
(``--rerun-triggers params``). So a key that no job of a study reads must rerun
nothing, and a key that one rule reads must rerun that rule's jobs alone. The
study here is the tiny test study with every job touched, not run: its outputs
exist and Snakemake has recorded each job's params.
"""

from pathlib import Path

import pytest
import yaml
from study_helpers import snakemake_output, touch_study

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "test" / "config.yaml"


@pytest.fixture(scope="module")
def touched_study(tmp_path_factory) -> Path:
    """The test study's outputs, made empty and touched, and the jobs' records."""
    workdir = tmp_path_factory.mktemp("touched-study")
    touch_study(workdir, CONFIG)
    return workdir


def rules_rerun_for_params(workdir: Path, config: dict, tmp_path: Path) -> set[str]:
    """The rules whose jobs a dry run would rerun because their params changed."""
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(config, sort_keys=False))
    plan = snakemake_output(workdir, "-n", "--rerun-triggers", "params", config=changed)
    rules, rule = set(), None
    for line in plan.splitlines():
        if line.startswith(("rule ", "localrule ")):
            rule = line.split()[1].rstrip(":")
        elif "reason:" in line and "Params have changed" in line:
            rules.add(rule)
    return rules


def edited(*edits: tuple[tuple[str, ...], object]) -> dict:
    config = yaml.safe_load(CONFIG.read_text())
    for keys, value in edits:
        section = config
        for key in keys[:-1]:
            section = section.setdefault(key, {})
        section[keys[-1]] = value
    return config


@pytest.mark.parametrize(
    "edits",
    [
        (),
        ((("sglang", "port"), 31234),),
        ((("sglang", "mem_fraction_static"), 0.5),),
        ((("container", "gpus"), "none"), (("container", "shm_size"), "2g")),
        ((("container", "embedded_python_version"), "3.12"),),
    ],
    ids=["nothing", "sglang port", "sglang memory", "container", "image python"],
)
def test_a_key_no_job_reads_reruns_nothing(touched_study, tmp_path, edits):
    assert rules_rerun_for_params(touched_study, edited(*edits), tmp_path) == set()


@pytest.mark.parametrize(
    "keys, value, rules",
    [
        (("monitors", "gpu"), "off", {"run_arm"}),
        (("client", "warmup_requests"), 5, {"run_arm"}),
        # The server's start: the arms' launch plans (their runs follow them).
        (("embedded_engine", "decode_step_ms"), 3, {"launch_plan"}),
    ],
)
def test_a_key_only_the_arms_read_reruns_only_the_arms(
    touched_study, tmp_path, keys, value, rules
):
    rerun = rules_rerun_for_params(touched_study, edited((keys, value)), tmp_path)
    assert rerun == rules
