"""Secrets go nowhere: a config that holds one is refused before anything reads it,
and a secret an arm names reaches its server from the runner's environment but no
file: not the results, not the logs, not Snakemake's own records in .snakemake/."""

import copy
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from study_helpers import STUDY_SECRETS, arm_record, container_plan, snakemake_command

from serving_study.config.records import (
    Arm,
    ClientSettings,
    MonitorSettings,
    ServerSettings,
    Variant,
)
from serving_study.config.secrets import (
    REDACTED,
    SECRET_WORD_PAIRS,
    SECRET_WORDS,
    SecretNotSet,
    has_credentials,
    is_secret,
    redacted_check,
)
from serving_study.config.validation import ConfigError, check_config
from serving_study.launch.engines import launch_plan
from serving_study.launch.plan import process_plan
from serving_study.measure.arm_runner import run_arm
from serving_study.measure.run_outputs import RunPaths
from serving_study.servers.container_commands import run_command
from serving_study.servers.environment import recorded_environment
from serving_study.servers.host import unmet_needs

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema" / "config.schema.yaml"
TEST_CONFIG = ROOT / "config" / "test" / "config.yaml"
CANARY = STUDY_SECRETS["HF_TOKEN"]
# Passed under a name that does not look secret: only secret_environment says so.
PLAIN_NAME = "STUDY_PROBE_VALUE"
PLAIN_NAME_CANARY = STUDY_SECRETS[PLAIN_NAME]
CANARIES = (CANARY.encode(), PLAIN_NAME_CANARY.encode())


def shipped(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


def check(config: dict) -> dict:
    return check_config(config, SCHEMA, ["bad.yaml"], ROOT)


def files_holding_a_canary(directory: Path) -> list[str]:
    return [
        str(path.relative_to(directory))
        for path in directory.rglob("*")
        if path.is_file()
        and not path.is_symlink()
        and any(canary in path.read_bytes() for canary in CANARIES)
    ]


# --- What is a secret ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY"]
    + ["--api-key", "--admin-api-key", "--ssl-keyfile-password", "DB_PASSWORD"],
)
def test_secret_names(name):
    assert is_secret(name)


@pytest.mark.parametrize(
    "name",
    ["TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "SGLANG_VLM_CACHE_SIZE_MB"]
    + ["--max-total-tokens", "--tokenizer-path", "--ssl-keyfile", "KEYBOARD"],
)
def test_names_that_only_look_alike_are_not_secrets(name):
    assert not is_secret(name)


def test_urls_with_credentials():
    assert has_credentials(f"https://user:{CANARY}@github.com/sgl-project/sglang")
    assert has_credentials(f"https://{CANARY}@github.com/sgl-project/sglang")
    assert has_credentials(f"--proxy=http://user:{CANARY}@proxy:3128")
    assert has_credentials(f"ssh://git:{CANARY}@example.org/sglang.git")
    assert not has_credentials("ssh://git@github.com/sgl-project/sglang.git")
    assert not has_credentials("git@github.com:sgl-project/sglang.git")
    assert not has_credentials("https://github.com/sgl-project/sglang.git")
    assert not has_credentials("/srv/git/sglang")


# --- A config that holds a secret is refused --------------------------------------


def plant_everywhere(config: dict) -> dict:
    """``config`` with the canary in every place a config can hold a secret."""
    config = copy.deepcopy(config)
    config["arms"][0]["environment"] = {
        "HF_TOKEN": CANARY,
        "HTTPS_PROXY": f"http://study:{CANARY}@proxy.example:3128",
    }
    config["arms"][1]["server_args"] = [f"--admin-api-key={CANARY}"]
    config.setdefault("sglang", {})["extra_server_args"] = ["--api-key", CANARY]
    config["sources"].append(
        {
            "name": "private-fork",
            "git": {
                "url": f"https://study:{CANARY}@github.com/study/sglang.git",
                "commit": "0" * 40,
            },
        }
    )
    config["bisect"] = {
        "repository": f"https://{CANARY}@github.com/study/sglang.git",
        "good": "v0.5.9",
        "bad": "v0.5.10",
        "arm": config["arms"][0]["name"],
    }
    return config


PLANTED_KEYS = (
    "arms[0].environment.HF_TOKEN",
    "arms[0].environment.HTTPS_PROXY",
    "arms[1].server_args[0]: --admin-api-key",
    "sglang.extra_server_args[0]: --api-key",
    # The key's value after it, shaped like an OpenAI key.
    "sglang.extra_server_args[1]: holds a value shaped like an access token",
    "sources[1].git.url",
    "bisect.repository",
)


def test_every_planted_secret_is_named_and_none_is_repeated():
    with pytest.raises(ConfigError) as raised:
        check(plant_everywhere(shipped("config/test/config.yaml")))
    lines = str(raised.value).splitlines()
    assert CANARY not in str(raised.value)
    for key in PLANTED_KEYS:
        assert [line for line in lines if line.startswith(f"bad.yaml: {key}")], key
    assert len(lines) == len(PLANTED_KEYS)
    assert "list HF_TOKEN under arms[0].secret_environment" in str(raised.value)


# A value of each shape, made up (no real token), under a name that looks bland.
TOKEN_SHAPED = {
    "Hugging Face": "hf_" + "a1B2c3D4e5" * 4,
    "OpenAI": "sk-proj-" + "Ab12Cd34Ef" * 3,
    "GitHub": "ghp_" + "Zy98Xw76Vu" * 4,
    "GitHub fine-grained": "github_pat_" + "11ABCDEFG0" * 3,
    "AWS": "AKIA" + "ABCDEFGHIJKLMNOP",
    "GitLab": "glpat-" + "xY12zW34vU" * 2,
    "Slack": "xoxb-" + "1234567890-abcdefghij",
}


@pytest.mark.parametrize("service", TOKEN_SHAPED)
def test_a_token_under_a_bland_name_is_refused_with_its_key(service):
    config = shipped("config/test/config.yaml")
    config["arms"][0]["environment"] = {"HUB_AUTH_SETTING": TOKEN_SHAPED[service]}
    with pytest.raises(ConfigError) as raised:
        check(config)
    message = str(raised.value)
    assert "arms[0].environment.HUB_AUTH_SETTING: looks like a secret" in message
    assert "secret_environment" in message
    assert TOKEN_SHAPED[service] not in message


def test_the_probe_and_the_config_check_share_one_secret_rule(monkeypatch):
    """The server-side probe (which runs without this package) reports no
    variable the config check would call secret, and hides none it would not."""
    probe_directory = ROOT / "envs" / "server-probe"
    monkeypatch.syspath_prepend(str(probe_directory))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # its finder goes
    monkeypatch.delenv("SERVING_STUDY_PAUSE_GC_AT_START", raising=False)
    probe = runpy.run_path(str(probe_directory / "sitecustomize.py"))
    assert probe["SECRET_WORDS"] == SECRET_WORDS
    assert probe["SECRET_WORD_PAIRS"] == SECRET_WORD_PAIRS
    names = [
        "HF_TOKEN",
        "OPENAI_API_KEY",
        "DB_PASSWD",
        "AWS_SECRET_ACCESS_KEY",
        "MY_APIKEY",
        "SSH_PRIVATE_KEY",
        "TOKENIZERS_PARALLELISM",
        "OMP_NUM_THREADS",
        "MAX_TOTAL_TOKENS",
        "KEY_ACCESS",
        "HUB_AUTH_SETTING",
        "GIT_CREDENTIALS",
    ]
    assert [probe["is_secret"](name) for name in names] == [
        is_secret(name) for name in names
    ]


def test_names_of_secrets_and_look_alikes_are_accepted():
    config = shipped("config/test/config.yaml")
    config["arms"][0]["secret_environment"] = ["HF_TOKEN", PLAIN_NAME]
    config["arms"][0]["environment"] = {"TOKENIZERS_PARALLELISM": "false"}
    config["sources"][0] = {
        "name": config["sources"][0]["name"],
        "git": {
            "url": "ssh://git@github.com/sgl-project/sglang.git",
            "commit": "a" * 40,
        },
    }
    checked = check(config)
    assert checked["arms"][0]["secret_environment"] == ["HF_TOKEN", PLAIN_NAME]
    assert checked["arms"][1]["secret_environment"] == []


def test_a_variable_is_either_set_or_passed():
    config = shipped("config/test/config.yaml")
    config["arms"][0]["environment"] = {PLAIN_NAME: "1"}
    config["arms"][0]["secret_environment"] = [PLAIN_NAME]
    with pytest.raises(ConfigError, match=r"arms\[0\].secret_environment: "):
        check(config)


def test_snakemake_refuses_a_config_with_secrets_and_writes_nothing_of_them(
    tmp_path,
):
    bad = tmp_path / "with-secrets.yaml"
    bad.write_text(yaml.safe_dump(plant_everywhere(shipped("config/test/config.yaml"))))
    workdir = tmp_path / "study"
    workdir.mkdir()
    finished = subprocess.run(
        snakemake_command(workdir, "--cores", "1", "all", config=bad),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode != 0
    for key in PLANTED_KEYS:
        assert f"{bad}: {key}" in finished.stderr
    assert CANARY not in finished.stdout + finished.stderr
    assert not (workdir / "results").exists()
    assert files_holding_a_canary(workdir) == []


# --- Secrets by name: commands, containers, records, preflight ---------------------


def test_a_container_gets_a_secret_by_name_only():
    plan = container_plan(
        ["true"],
        "sha256:" + "a" * 64,
        environment={"OMP_NUM_THREADS": "8"},
        secret_environment=("HF_TOKEN", PLAIN_NAME),
    )
    argv = run_command(plan, "n", "n")
    environment = [argv[i + 1] for i, item in enumerate(argv) if item == "--env"]
    assert environment == ["OMP_NUM_THREADS=8", "HF_TOKEN", PLAIN_NAME]


def test_a_launch_plan_names_the_arms_secrets(tmp_path):
    config = check(shipped("config/p4.yaml"))
    arm = Arm.from_config(config["arms"][0] | {"secret_environment": ["HF_TOKEN"]})
    (tmp_path / "image.iid").write_text("sha256:" + "a" * 64)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"images": [{"width": 64, "height": 64}]}))
    server = ServerSettings.from_config(
        config,
        image_id_file=tmp_path / "image.iid",
        model_snapshot={"path": "/data/qwen"},
    )
    variant = {"name": "v", "sglang_python_root": "/v", "mm_utils_sha256": "0" * 64}
    plan = launch_plan(server, arm, Variant.from_identity(variant), manifest)
    container = run_command(plan, "n", "n")
    assert container[container.index("HF_TOKEN") - 1] == "--env"
    record = plan.record()
    assert record["secret_environment"] == ["HF_TOKEN"]
    assert "HF_TOKEN" not in record["environment"]


def test_records_show_that_a_secret_arrived_never_its_value():
    expected = {"OMP_NUM_THREADS": "1", "HF_TOKEN": CANARY, PLAIN_NAME: "x"}
    arrived = {"OMP_NUM_THREADS": "1", "HF_TOKEN": CANARY, PLAIN_NAME: "x"}
    assert redacted_check(expected, arrived, [PLAIN_NAME]) == (
        {"OMP_NUM_THREADS": "1", "HF_TOKEN": REDACTED, PLAIN_NAME: REDACTED},
        {"OMP_NUM_THREADS": "1", "HF_TOKEN": REDACTED, PLAIN_NAME: REDACTED},
    )
    wrong = {"OMP_NUM_THREADS": "1", "HF_TOKEN": "another", PLAIN_NAME: None}
    recorded_expected, recorded_seen = redacted_check(expected, wrong, [PLAIN_NAME])
    assert recorded_seen["HF_TOKEN"] not in (REDACTED, "another", CANARY)
    assert recorded_seen[PLAIN_NAME] is None
    assert recorded_expected[PLAIN_NAME] == REDACTED


def test_preflight_refuses_a_host_without_the_arms_secrets(monkeypatch):
    monkeypatch.delenv(PLAIN_NAME, raising=False)
    arms = [arm_record(secret_environment=[PLAIN_NAME]), arm_record(name="B")]
    engine = {"engine": "embedded", "runtime": "local"}
    host = {"shared_memory_free_mib": None}
    needs = unmet_needs(host, engine, arms)
    assert len(needs) == 1 and f"arm A passes {PLAIN_NAME}" in needs[0]
    monkeypatch.setenv(PLAIN_NAME, PLAIN_NAME_CANARY)
    assert unmet_needs(host, engine, arms) == []


def test_the_runner_starts_nothing_without_a_named_secret(monkeypatch, tmp_path):
    monkeypatch.delenv(PLAIN_NAME, raising=False)
    arm = arm_record(secret_environment=[PLAIN_NAME])
    variant = {"name": "v", "sglang_python_root": "/v", "mm_utils_sha256": "0" * 64}
    with pytest.raises(SecretNotSet, match=f"arm A passes {PLAIN_NAME}"):
        run_arm(
            experiment="secrets",
            arm=arm,
            run=1,
            variant=Variant.from_identity(variant),
            workload_manifest=tmp_path / "no-manifest.json",
            plan=process_plan(["true"]),
            client=ClientSettings.from_config({}),
            monitors=MonitorSettings.from_config({}),
            paths=RunPaths.in_directory(tmp_path),
        )
    assert list(tmp_path.iterdir()) == []


# --- Whole studies: the secrets reach the servers and no file ----------------------


def study_with_secrets(
    tmp_path: Path, base: Path, experiment: str
) -> tuple[Path, Path]:
    """(working directory, config): ``base`` with one arm that names two secrets,
    as an experiment of its own (other tests may run the base study meanwhile)."""
    config = shipped(str(base.relative_to(ROOT)))
    arm = config["arms"][0] | {"secret_environment": ["HF_TOKEN", PLAIN_NAME]}
    config |= {"experiment": experiment, "arms": [arm], "claims": []}
    path = tmp_path / "with-secret-names.yaml"
    path.write_text(yaml.safe_dump(config))
    workdir = tmp_path / "study"
    workdir.mkdir()
    return workdir, path


def run_study_with_secrets(workdir: Path, config: Path) -> dict:
    """Run ``all`` with the canaries in Snakemake's environment; the arm's checks."""
    finished = subprocess.run(
        snakemake_command(workdir, "--cores", "2", "all", config=config),
        capture_output=True,
        text=True,
        timeout=1800,
        env=os.environ | STUDY_SECRETS,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert not any(
        canary.decode() in finished.stdout + finished.stderr for canary in CANARIES
    )
    settings = yaml.safe_load(config.read_text())
    run = workdir / "results" / settings["experiment"] / settings["arms"][0]["name"]
    run /= "run1"
    return json.loads((run / "metrics.json").read_text())


def assert_delivered_and_nowhere(workdir: Path, metrics: dict) -> None:
    # The runner compared the values in the server's own environment with its own:
    # a wrong or missing one would show here and among the run's invalid reasons.
    # (Whether the run is valid also depends on how busy the host was.)
    assert not [
        reason
        for reason in metrics.get("invalid_reasons", [])
        if "HF_TOKEN" in reason or PLAIN_NAME in reason
    ]
    assert metrics["checks"]["environment_seen"] == {
        "HF_TOKEN": REDACTED,
        PLAIN_NAME: REDACTED,
    }
    assert (workdir / ".snakemake").is_dir()
    assert files_holding_a_canary(workdir) == []


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0, reason="the arms' CPU quota is a cgroup only root can create"
)
def test_a_study_passes_secrets_to_its_server_and_writes_them_nowhere(tmp_path):
    workdir, config = study_with_secrets(tmp_path, TEST_CONFIG, "secrets-embedded")
    metrics = run_study_with_secrets(workdir, config)
    assert_delivered_and_nowhere(workdir, metrics)


@pytest.mark.slow
@pytest.mark.docker
def test_a_study_in_containers_passes_secrets_by_name_and_writes_them_nowhere(
    docker_study,
):
    """The container tests' study (conftest.py), whose first arm names both
    secrets; Snakemake's output is among its files."""
    run = docker_study / "results/test-docker/original/run1"
    metrics = json.loads((run / "metrics.json").read_text())
    assert_delivered_and_nowhere(docker_study, metrics)
    assert (docker_study / "snakemake.out").is_file()
    provenance = json.loads((run / "provenance.json").read_text())
    argv = provenance["runtime_argv"]
    assert argv[argv.index("HF_TOKEN") - 1] == "--env"
    assert argv[argv.index(PLAIN_NAME) - 1] == "--env"
    # The container ran unprivileged, from the image id the build wrote.
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    image_id = (
        (docker_study / "results/test-docker/images/original.iid").read_text().strip()
    )
    assert provenance["image_run"] == provenance["image"] == image_id


def test_recorded_host_settings_never_hold_credentials():
    recorded = recorded_environment(
        {
            "HF_ENDPOINT": "https://user:pass@mirror.example/hub",
            "HF_HUB_CACHE": "/data/hf",
            "SGLANG_AUTH": TOKEN_SHAPED["Hugging Face"],
            "OMP_NUM_THREADS": "4",
        }
    )
    assert recorded == {
        "HF_ENDPOINT": REDACTED,
        "HF_HUB_CACHE": "/data/hf",
        "OMP_NUM_THREADS": "4",
        "SGLANG_AUTH": REDACTED,
    }
