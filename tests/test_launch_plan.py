"""The launch plan: one value per server start, one vocabulary per setting.

What a plan holds travels through its record unchanged (commands/<arm>.json and
every run's provenance hold it), a secret travels by name only, a local server
keeps only the host variables the plan names, and every choice the schema offers
is one the code knows, in the same words.
"""

import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import pytest
from study_helpers import arm_record

from serving_study.config.platform import DEVICES
from serving_study.config.records import GPU_SAMPLING, ServerSettings, Variant
from serving_study.config.schema import property_schema
from serving_study.engine.protocol import TRANSPORTS
from serving_study.engine.request_path import PREPROCESS_DEVICES
from serving_study.launch.engines import ENGINES, launch_plan
from serving_study.launch.plan import (
    QUOTA_SCOPES,
    QUOTA_TIMINGS,
    LaunchPlan,
    process_plan,
)
from serving_study.servers.container_commands import RUNTIMES
from serving_study.servers.environment import THREAD_SETTINGS
from serving_study.servers.local_runtime import LocalServer

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "serving_study"
VARIANT = Variant.from_identity(
    {"name": "v", "sglang_python_root": "/v/python", "mm_utils_sha256": "0" * 64}
)
EMBEDDED = ServerSettings.from_config({"engine": "embedded", "runtime": "local"})


def enum(*keys: str) -> set:
    return set(property_schema(*keys)["enum"])


@pytest.mark.parametrize(
    "keys, code",
    [
        (("engine",), set(ENGINES)),
        (("runtime",), {"local", *RUNTIMES}),
        (("arms", "transport"), set(TRANSPORTS)),
        (("thread_quota_map", "transport"), set(TRANSPORTS)),
        (("arms", "quota_scope"), set(QUOTA_SCOPES)),
        (("arms", "quota_timing"), set(QUOTA_TIMINGS)),
        (("sglang", "device"), {"auto", *DEVICES}),
        (("embedded_engine", "preprocess_device"), {"auto", *PREPROCESS_DEVICES}),
        (("monitors", "gpu"), set(GPU_SAMPLING)),
    ],
    ids=lambda value: ".".join(value) if isinstance(value, tuple) else None,
)
def test_the_schema_and_the_code_offer_the_same_choices(keys, code):
    assert enum(*keys) == code


def test_a_quota_is_parsed_in_one_place():
    """A quota of "none" becomes None where the config is read, nowhere else."""
    parses = re.compile(r'\bNO_QUOTA\b|quota.*[!=]= "none"')
    readers = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if parses.search(path.read_text())
    )
    assert readers == ["config/records.py"]


def test_a_plan_reads_back_from_its_record_as_it_was(tmp_path):
    arm = arm_record(
        cpu_quota=0.5,
        quota_timing="start",
        environment={"OMP_NUM_THREADS": "1"},
        secret_environment=["HF_TOKEN"],
        intra_op_threads=2,
    )
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"images": [{"width": 64, "height": 64}]}))
    plan = launch_plan(EMBEDDED, arm, VARIANT, manifest, port=4321)
    record = json.loads(json.dumps(plan.record()))
    assert LaunchPlan.from_record(record) == plan
    assert record["command"][-2:] == ["--port", "4321"]
    assert record["quota"] == {"cores": 0.5, "scope": "server", "timing": "start"}
    assert record["secret_environment"] == ["HF_TOKEN"]
    assert plan.for_run(99).command()[-2:] == ["--port", "99"]


def test_a_secret_value_is_never_recorded_and_a_redacted_one_never_run(tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"images": [{"width": 64, "height": 64}]}))
    arm = arm_record(environment={"HF_TOKEN": "hf_canary"})
    record = launch_plan(EMBEDDED, arm, VARIANT, manifest).record()
    assert "hf_canary" not in json.dumps(record)
    with pytest.raises(ValueError, match="HF_TOKEN redacted.*secret_environment"):
        LaunchPlan.from_record(record)


PRINT_ENVIRONMENT = "import json, os; print(json.dumps(dict(os.environ)), flush=True)"


def test_a_local_server_keeps_only_what_its_plan_names(tmp_path, monkeypatch):
    monkeypatch.setenv("UNRELATED_SETTING", "from the shell")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_canary")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("PASSED_SECRET", "given by name")
    plan = dataclasses.replace(
        process_plan([sys.executable, "-c", PRINT_ENVIRONMENT]),
        environment={"ARM_SETTING": "1"},
        secret_environment=("PASSED_SECRET",),
    )
    server = LocalServer(
        plan, f"plan-environment-{time.monotonic_ns()}", tmp_path / "log"
    )
    server.start()
    try:
        server.process.wait(timeout=30)
    finally:
        server.stop()
    seen = json.loads((tmp_path / "log").read_text().splitlines()[-1])
    assert seen["ARM_SETTING"] == "1" and seen["PASSED_SECRET"] == "given by name"
    assert seen["PATH"]
    assert not {"UNRELATED_SETTING", "GITHUB_TOKEN"} & set(seen)
    assert not set(THREAD_SETTINGS) & set(seen)


def test_a_servers_start_chooses_its_engine_by_name_in_one_place():
    """Starting, running and checking a server never branch on the engine's
    name: launch/engines.py picks the adapter, and the plan says the rest."""
    branches = re.compile(r'engine (==|!=) "')
    found = sorted(
        path.relative_to(PACKAGE).as_posix()
        for folder in ("launch", "servers", "measure")
        for path in (PACKAGE / folder).rglob("*.py")
        if branches.search(path.read_text())
    )
    assert found == []
    assert set(ENGINES) == {"embedded", "sglang"}
