"""The config's records: one place that normalises, defaults from the schema alone,
and plain config values that a job turns back into the same records."""

import inspect
from pathlib import Path

import pytest
import yaml

from serving_study.config import records
from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    ServerSettings,
    Workload,
)
from serving_study.config.schema import property_schema
from serving_study.config.validation import check_config
from serving_study.measure.client import run_load
from serving_study.servers.container_runtime import ContainerServer
from serving_study.servers.local_runtime import LocalServer
from serving_study.sources.tiny_model_settings import TinyModelSettings

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema" / "config.schema.yaml"
CONFIGS = sorted(
    path for path in (ROOT / "config").rglob("*.yaml") if path.parent.name != "schema"
)
SECTIONS = {
    ClientSettings: "client",
    MonitorSettings: "monitors",
    HostSharing: "host_sharing",
}


def checked(path: Path) -> dict:
    return check_config(yaml.safe_load(path.read_text()), SCHEMA, [path], ROOT)


def job_records(config: dict) -> list:
    """Every record a job builds, from the plain values its rule passes it."""
    found = [ServerSettings.from_config(ServerSettings.from_config(config).as_config())]
    found += [
        Arm.from_config(Arm.from_config(arm).as_config()) for arm in config["arms"]
    ]
    found += [
        Workload.from_config(Workload.from_config(workload).as_config())
        for workload in config["workloads"]
    ]
    for record, key in SECTIONS.items():
        found.append(record.from_config(record.from_config(config[key]).as_config()))
    return found


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.stem)
def test_a_job_rebuilds_the_records_the_workflow_built(path):
    config = checked(path)
    built = [ServerSettings.from_config(config)]
    built += [Arm.from_config(arm) for arm in config["arms"]]
    built += [Workload.from_config(workload) for workload in config["workloads"]]
    built += [record.from_config(config[key]) for record, key in SECTIONS.items()]
    assert job_records(config) == built


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.stem)
def test_a_job_never_reads_the_schema(path, monkeypatch):
    """A job's params carry every value, so the schema is no hidden input."""
    config = checked(path)
    records_of = {
        "server": ServerSettings.from_config(config).as_config(),
        "arms": [Arm.from_config(arm).as_config() for arm in config["arms"]],
    }

    def unread(*keys):
        raise AssertionError(f"the schema was read for {keys}")

    monkeypatch.setattr(records, "property_schema", unread)
    ServerSettings.from_config(records_of["server"])
    for arm in records_of["arms"]:
        Arm.from_config(arm)


def test_a_quota_of_none_is_no_quota_and_back():
    arm = Arm.from_config(
        {
            "name": "A",
            "variant": "v",
            "workload": "w",
            "cpu_quota": "none",
            "concurrency": 1,
            "requests": 1,
            "environment": {"OMP_NUM_THREADS": "4"},
        }
    )
    assert arm.cpu_quota is None
    assert arm.as_config()["cpu_quota"] == "none"
    assert Arm.from_config(arm.as_config() | {"cpu_quota": 2}).cpu_quota == 2.0
    assert arm.environment == {"OMP_NUM_THREADS": "4"}


def test_what_a_caller_leaves_out_is_the_schemas_default():
    client = ClientSettings.from_config({})
    for name, value in client.as_config().items():
        assert value == property_schema("client", name)["default"], name
    arm = Arm.from_config(
        {
            "name": "A",
            "variant": "v",
            "workload": "w",
            "cpu_quota": 1,
            "concurrency": 1,
            "requests": 1,
        }
    )
    assert arm.output_tokens == property_schema("arms", "output_tokens")["default"]
    assert arm.quota_timing == property_schema("arms", "quota_timing")["default"]
    assert arm.intra_op_threads is None
    with pytest.raises(ValueError, match="arms lacks variant, workload"):
        Arm.from_config({"name": "A", "cpu_quota": 1, "concurrency": 1, "requests": 1})


def test_no_code_default_disagrees_with_the_schema():
    """The records supply what the schema says: the code states no other value."""
    for server in (LocalServer, ContainerServer):
        # A runtime takes its quota and its timing from the plan alone.
        assert list(inspect.signature(server).parameters) == [
            "plan",
            "group_name",
            "log_path",
        ]
    timeout = inspect.signature(run_load).parameters["request_timeout_s"]
    assert timeout.default is inspect.Parameter.empty
    dtype = property_schema("sglang", "tiny_model", "dtype")["default"]
    assert TinyModelSettings(seed=0).dtype == dtype


def test_a_server_gets_only_the_sections_it_reads():
    config = checked(ROOT / "config" / "test" / "config.yaml")
    embedded = ServerSettings.from_config(config).as_config()
    assert set(embedded) == {"engine", "runtime", "embedded_engine"}

    config = checked(ROOT / "config" / "b1.yaml")
    config["sglang"]["port"] = 31234
    sglang = ServerSettings.from_config(config).as_config()
    assert set(sglang) == {"engine", "runtime", "sglang", "container"}
    assert "port" not in sglang["sglang"] and "base_image" not in sglang["sglang"]
    assert set(sglang["container"]) <= set(records.CONTAINER_SERVER_KEYS)
