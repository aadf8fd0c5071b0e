"""An arm's OpenMP settings are checked before any job runs: a typo in a thread
knob would otherwise run silently as the default it was meant to change."""

from pathlib import Path

import pytest
import yaml
from study_helpers import snakemake_refuses

from serving_study.config.validation import ConfigError, check_config

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema" / "config.schema.yaml"

ACCEPTED = {
    "OMP_NUM_THREADS": ["1", "16", "8,2"],
    "OMP_WAIT_POLICY": ["PASSIVE", "active"],
    "GOMP_SPINCOUNT": ["0", "300000", "10k", "infinite"],
    "OMP_DYNAMIC": ["false"],
    "OMP_PROC_BIND": ["close", "spread,close", "TRUE"],
    "KMP_BLOCKTIME": ["0", "200ms", "infinite"],
}
REFUSED = {
    "OMP_NUM_THREADS": ["0", "-1", "two", "4\n", ""],
    "OMP_WAIT_POLICY": ["sometimes", "PASSIVE\n"],
    "GOMP_SPINCOUNT": ["-5", "lots", "10x"],
    "OMP_DYNAMIC": ["yes"],
    "OMP_PROC_BIND": ["nearby"],
    "KMP_BLOCKTIME": ["soon"],
}


def config_with(environment: dict) -> dict:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["arms"][1]["environment"] = environment
    return config


@pytest.mark.parametrize(
    "name, value",
    [(name, value) for name, values in ACCEPTED.items() for value in values],
)
def test_values_the_openmp_runtime_accepts_pass(name, value):
    checked = check_config(config_with({name: value}), SCHEMA, ["bad.yaml"], ROOT)
    assert checked["arms"][1]["environment"] == {name: value}


@pytest.mark.parametrize(
    "name, value",
    [(name, value) for name, values in REFUSED.items() for value in values],
)
def test_a_bad_value_names_the_arm_and_key(name, value):
    with pytest.raises(ConfigError) as raised:
        check_config(config_with({name: value}), SCHEMA, ["bad.yaml"], ROOT)
    assert f"bad.yaml: arms[1].environment.{name}: {value!r} is not allowed" in str(
        raised.value
    )


@pytest.mark.parametrize("name", ["OMP_WAIT_POLCY", "GOMP_SPIN_COUNT", "KMP_BLOCK"])
def test_an_unknown_openmp_variable_is_refused_with_the_known_ones(name):
    with pytest.raises(ConfigError) as raised:
        check_config(config_with({name: "1"}), SCHEMA, ["bad.yaml"], ROOT)
    message = str(raised.value)
    assert f"arms[1].environment.{name}: not a thread variable this study knows" in (
        message
    )
    assert "OMP_WAIT_POLICY" in message and "GOMP_SPINCOUNT" in message


def test_other_variables_are_free():
    environment = {"HF_HUB_ENABLE_HF_TRANSFER": "1", "MY_OMP_NOTE": "x"}
    checked = check_config(config_with(environment), SCHEMA, ["bad.yaml"], ROOT)
    assert checked["arms"][1]["environment"] == environment


def test_snakemake_refuses_a_bad_wait_policy_before_any_job(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config_with({"OMP_WAIT_POLICY": "sometimes"})))
    refused = snakemake_refuses(bad)
    assert "arms[1].environment.OMP_WAIT_POLICY: 'sometimes'" in refused
