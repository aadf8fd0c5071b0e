"""Each claim says where its bound came from (``bound_from``): the config check
refuses a claim that does not, or says it wrongly, naming the key; the claims table
and so the report put it beside the verdict, a test or a confirmation; and what the
shipped configs say of their pilots is what the commits they name hold."""

import io
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from serving_study.analysis.aggregate import tables_from_metrics
from serving_study.config.records import BoundSource
from serving_study.config.validation import ConfigError, check_config

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema" / "config.schema.yaml"
FIXTURE = ROOT / "tests" / "fixtures" / "report" / "config.yaml"
SHIPPED = sorted(
    path
    for path in (ROOT / "config").rglob("*.yaml")
    if path.name != "config.schema.yaml"
)


def default_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def refusal(config: dict) -> str:
    with pytest.raises(ConfigError) as raised:
        check_config(config, SCHEMA, ["bad.yaml"], ROOT)
    return str(raised.value)


def test_a_claim_without_bound_from_is_refused():
    config = default_config()
    del config["claims"][0]["bound_from"]
    assert "bad.yaml: claims[0]: 'bound_from' is a required property" in refusal(config)


def test_a_bound_from_of_an_unknown_kind_is_refused_naming_the_key():
    config = default_config()
    config["claims"][2]["bound_from"]["kind"] = "hunch"
    assert (
        "bad.yaml: claims[2].bound_from.kind: 'hunch' is not one of "
        "['study', 'reasoning', 'pilot', 'redesign']"
    ) in refusal(config)


@pytest.mark.parametrize("kind", ["pilot", "redesign"])
@pytest.mark.parametrize("missing", ["result", "committed"])
def test_a_pilot_or_a_redesign_says_its_figures_and_where_they_are(kind, missing):
    config = default_config()
    source = config["claims"][3]["bound_from"]
    source["kind"] = kind
    del source[missing]
    message = refusal(config)
    assert f"claims[3].bound_from: '{missing}' is a required property" in message


@pytest.mark.parametrize(
    "committed", [True, "docs/results/x/tables/claims.csv", "f126b48 claims.csv"]
)
def test_committed_is_a_commit_and_a_path_or_false(committed):
    config = default_config()
    config["claims"][3]["bound_from"]["committed"] = committed
    assert "claims[3].bound_from.committed: " in refusal(config)


def test_the_record_carries_where_a_bound_came_from():
    source = BoundSource.from_config(
        {"kind": "pilot", "what": "a run", "result": "1.5x", "committed": False}
    )
    assert source == BoundSource("pilot", "a run", "1.5x", None)
    study = BoundSource.from_config({"kind": "study", "what": "B1's 2.7x"})
    assert (study.result, study.committed) == (None, None)


def test_tables_refuse_a_claim_that_does_not_say_where_its_bound_came_from():
    """The tables are made from configs the schema passed; a config built by hand
    that lacks the key is refused by name all the same."""
    config = yaml.safe_load(FIXTURE.read_text())
    del config["claims"][1]["bound_from"]
    with pytest.raises(
        ValueError, match="claim 'patch_cuts_main_cpu' lacks bound_from"
    ):
        tables_from_metrics([], config)


def shipped_sources() -> list[tuple[str, str, dict]]:
    """(config, claim, bound_from) of every claim of every shipped config."""
    return [
        (path.relative_to(ROOT).as_posix(), claim["name"], claim["bound_from"])
        for path in SHIPPED
        for claim in yaml.safe_load(path.read_text()).get("claims") or []
    ]


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def history():
    shallow = git("rev-parse", "--is-shallow-repository").stdout.strip()
    if shallow != "false":
        pytest.skip("needs the checkout's whole git history")


# A ratio as a config quotes it: "C-main/A-main 1.50x", "B-main/A-main was 1.17x".
QUOTED_RATIO = re.compile(r"([\w.-]+)/([\w.-]+)(?: was)? (\d+\.\d+)x")


@pytest.mark.parametrize(
    ("config", "claim", "source"),
    [entry for entry in shipped_sources() if entry[2].get("committed")],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_committed_pilot_is_in_the_commit_it_names(history, config, claim, source):
    """Every ratio the evidence quotes is in the claims table at that address."""
    shown = git("show", source["committed"])
    assert shown.returncode == 0, (config, claim, shown.stderr)
    table = pd.read_csv(io.StringIO(shown.stdout))
    quoted = QUOTED_RATIO.findall(source["result"])
    assert quoted, (config, claim)
    for numerator, denominator, value in quoted:
        ratios = table[table["kind"] == "ratio"]
        (row,) = ratios[ratios["arms"] == f"{numerator}, {denominator}"].itertuples()
        assert f"{row.value:.{len(value.split('.')[1])}f}" == value, (config, claim)


def test_the_shipped_configs_say_where_every_bound_came_from():
    """Which claims are confirmations, as git history shows (issue #32): the fix
    bounds came from pilots, the real server's design (ii) from a redesign."""
    kinds = {
        (config, claim): source["kind"] for config, claim, source in shipped_sources()
    }
    redesigned = {key for key, kind in kinds.items() if kind == "redesign"}
    assert redesigned == {
        ("config/sglang-cpu.yaml", "patch-recovers-main-process"),
        ("config/sglang-cpu.yaml", "thread-cap-recovers-main-process"),
    }
    for config in ("config/config.yaml", "config/gpu-host.yaml"):
        for claim in (
            "passive-wait-recovers-throughput",
            "no-spin-recovers-throughput",
        ):
            assert kinds[(config, claim)] == "pilot", (config, claim)
    fixes = [key for key in kinds if key[0] == "config/sglang-cpu-fixes.yaml"]
    assert {kinds[key] for key in fixes if "recovers" in key[1]} == {"pilot"}
    for config in ("config/b1.yaml", "config/p4.yaml", "config/p5.yaml"):
        assert {kind for key, kind in kinds.items() if key[0] == config} == {"study"}
