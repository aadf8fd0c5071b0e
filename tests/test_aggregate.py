"""Per-arm medians, ratios, invalid runs, earlier attempts and claim verdicts from
the hand-computed fixture in tests/fixtures/report (its README has the numbers)."""

import copy
import json
import math
import platform
import shutil
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
import yaml

from serving_study.analysis.aggregate import (
    aggregate,
    read_tables,
    tables_from_metrics,
    write_tables,
)
from serving_study.config.records import Arm
from serving_study.measure.run_attempts import RunAttempts
from serving_study.measure.run_metrics import failed_run_metrics, summarize_run
from serving_study.measure.run_node import describe_node, node_record
from serving_study.measure.run_outputs import RunPaths
from serving_study.metric_catalogue import METRICS

FIXTURE = Path(__file__).parent / "fixtures" / "report"


def fixture_config() -> dict:
    return yaml.safe_load((FIXTURE / "config.yaml").read_text())


def write_fixture_metrics(out_dir: Path) -> list[Path]:
    """Summarize every fixture run into out_dir/<arm>/run<k>/metrics.json, with
    the run's attempts.json beside it, as the arm runner leaves them."""
    arms = {arm["name"]: Arm.from_config(arm) for arm in fixture_config()["arms"]}
    paths = []
    for directory in sorted((FIXTURE / "runs").glob("*/run*")):
        checks = json.loads((directory / "checks.json").read_text())
        metrics = summarize_run(
            directory / "requests.jsonl",
            directory / "monitors.json",
            arms[directory.parent.name],
            checks,
        )
        path = out_dir / directory.parent.name / directory.name / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(metrics))
        shutil.copyfile(directory / "attempts.json", path.with_name("attempts.json"))
        paths.append(path)
    return paths


def beside(metrics_paths: list[Path], name: str) -> list[Path]:
    """Each run's file ``name``, beside its metrics.json."""
    return [path.with_name(name) for path in metrics_paths]


def aggregate_runs(metrics_paths: list[Path], config: dict, provenance: bool = False):
    """The tables as rule aggregate builds them: every run's metrics and its
    attempts.json (and, with provenance, its provenance.json)."""
    return aggregate(
        metrics_paths,
        config,
        attempts_paths=beside(metrics_paths, "attempts.json"),
        provenance_paths=beside(metrics_paths, "provenance.json") if provenance else [],
    )


@pytest.fixture
def tables(tmp_path) -> dict[str, pd.DataFrame]:
    return aggregate_runs(write_fixture_metrics(tmp_path), fixture_config())


def arm_row(tables, arm: str, metric: str) -> pd.Series:
    arms = tables["arms"]
    return arms[(arms["arm"] == arm) & (arms["metric"] == metric)].iloc[0]


def test_runs_table_has_every_run_in_config_order(tables):
    runs = tables["runs"]
    assert list(zip(runs["arm"], runs["run"], strict=True)) == [
        ("original", 1),
        ("original", 2),
        ("original", 3),
        ("patched", 1),
        ("patched", 2),
        ("patched", 3),
    ]
    assert runs["valid"].tolist() == [True, True, True, True, True, False]
    assert runs["throughput_rps"].tolist() == pytest.approx(
        [2.0, 1.0, 1.6, 4.0, 5.0, 6.0]
    )


@pytest.mark.parametrize(
    ("arm", "metric", "median", "low", "high", "valid"),
    [
        ("original", "throughput_rps", 1.6, 1.0, 2.0, 3),
        ("patched", "throughput_rps", 4.5, 4.0, 5.0, 2),
        ("original", "ttft_p50_ms", 250.0, 250.0, 400.0, 3),
        ("patched", "ttft_p50_ms", 55.0, 50.0, 60.0, 2),
        ("original", "main_cpu_percent", 170.0, 150.0, 190.0, 3),
        ("patched", "main_cpu_percent", 50.0, 40.0, 60.0, 2),
        ("original", "output_tokens_per_s", 12.8, 8.0, 16.0, 3),
    ],
)
def test_arm_medians_use_valid_runs_only(tables, arm, metric, median, low, high, valid):
    row = arm_row(tables, arm, metric)
    assert row["median"] == pytest.approx(median)
    assert row["min"] == pytest.approx(low)
    assert row["max"] == pytest.approx(high)
    assert row["n_valid"] == valid
    assert row["n_total"] == 3


def test_reference_values_sit_beside_the_medians(tables):
    assert arm_row(tables, "original", "throughput_rps")["reference"] == 8.6
    assert arm_row(tables, "patched", "ttft_p50_ms")["reference"] == 342.0
    assert math.isnan(arm_row(tables, "patched", "e2e_p50_ms")["reference"])


def test_no_interval_below_five_runs_and_the_note_says_why(tables):
    row = arm_row(tables, "original", "throughput_rps")
    assert math.isnan(row["ci_low"]) and math.isnan(row["ci_high"])
    assert row["ci_note"] == (
        "3 valid runs: no bootstrap interval (needs 5); [min, max] covers the "
        "true median with probability 75%"
    )


def test_five_valid_runs_get_a_reproducible_bootstrap_interval():
    config = fixture_config()
    arm = Arm.from_config(config["arms"][0])
    records = []
    for run, value in enumerate([10.0, 11.0, 12.0, 13.0, 30.0], start=1):
        record = failed_run_metrics(arm, run, "unused")
        record.update(valid=True, invalid_reasons=[], throughput_rps=value)
        records.append(record)

    first = tables_from_metrics(records, config)
    second = tables_from_metrics(records, config)
    row = arm_row(first, "original", "throughput_rps")
    assert row["median"] == 12.0
    assert 10.0 <= row["ci_low"] <= 12.0 <= row["ci_high"] <= 30.0
    assert row["ci_low"] < row["ci_high"]
    assert row["ci_note"].startswith("bootstrap percentile interval")
    assert row["ci_low"] == arm_row(second, "original", "throughput_rps")["ci_low"]


def test_ratios_are_of_medians_with_per_block_ratios(tables):
    ratios = tables["ratios"].set_index("claim")
    throughput = ratios.loc["patch_recovers_throughput"]
    assert throughput["numerator_median"] == pytest.approx(4.5)
    assert throughput["denominator_median"] == pytest.approx(1.6)
    assert throughput["ratio_of_medians"] == pytest.approx(2.8125)
    assert throughput["reference_ratio"] == pytest.approx(2.70)
    assert throughput["paired_blocks"] == 2
    assert throughput["block_ratios"] == "run1 2; run2 5"
    assert throughput["block_ratio_min"] == pytest.approx(2.0)
    assert throughput["block_ratio_max"] == pytest.approx(5.0)
    # No reference_ratio in the claim: the study's ratio comes from its numbers.
    assert ratios.loc["patch_cuts_main_cpu", "reference_ratio"] == pytest.approx(
        44 / 1089
    )


def test_invalid_runs_are_listed_with_their_reasons(tables):
    invalid = tables["invalid_runs"]
    assert invalid.to_dict("records") == [
        {
            "arm": "patched",
            "run": 3,
            "reasons": "1 of 4 measured requests did not complete (first: request 4: "
            "HTTP 500: engine overloaded <script>alert(1)</script>); dispatch lag "
            "reached 80.0 ms, above the allowed 50 ms: the client fell behind its "
            "schedule",
        }
    ]


def test_verdict_sentences(tables):
    claims = tables["claims"].set_index("claim")
    assert claims["verdict"].to_dict() == {
        "patch_recovers_throughput": "holds",
        "patch_cuts_main_cpu": "cannot tell",
        "ttft_alike": "does not hold",
    }
    assert claims["sentence"].tolist() == [
        "patched copy recovers at least 2x throughput: holds here, a test of a "
        "bound from the study (2.81x; 2 of 2 paired runs meet it; study 2.7x)",
        "patched copy at most halves main-process CPU: cannot tell here, a "
        "confirmation of a bound from a pilot (patched has 2 valid runs of 3; "
        "the claim needs 3; study 0.0404x)",
        "both arms have alike TTFT: does not hold here, a confirmation of a bound "
        "from a redesign after a failed verdict (original, patched: medians 55 to "
        "250 ms, spread 354.5%, allowed 10%; study 337.7%)",
    ]
    assert claims.loc["ttft_alike", "value"] == pytest.approx(250 / 55 - 1)


def test_beside_each_verdict_where_its_bound_came_from(tables):
    """A test where the bound came from the study (or our reasoning), a
    confirmation where it came after a run of the same effect."""
    claims = tables["claims"].set_index("claim")
    columns = list(claims.columns)
    assert columns[columns.index("verdict") + 1 :][:2] == ["judged_as", "bound_from"]
    assert claims["judged_as"].to_dict() == {
        "patch_recovers_throughput": "test",
        "patch_cuts_main_cpu": "confirmation",
        "ttft_alike": "confirmation",
    }
    assert claims["bound_from"].to_dict() == {
        "patch_recovers_throughput": "the study: B1's C/A of 2.70x, as at least 2x",
        "patch_cuts_main_cpu": "a pilot: an earlier run of this fixture; "
        "patched/original main-process CPU 0.4x; not committed",
        "ttft_alike": "a redesign after a failed verdict: the workload's images "
        "moved from 512 px to 256 px; the arms' TTFT 20% apart, does not hold; "
        "committed in 0123abc:docs/results/example/tables/claims.csv",
    }


def test_our_own_reasoning_makes_a_test(tmp_path):
    config = fixture_config()
    config["claims"][1]["bound_from"] = {"kind": "reasoning", "what": "a guess"}
    claim = aggregate(write_fixture_metrics(tmp_path), config)["claims"].iloc[1]
    assert (claim["judged_as"], claim["bound_from"]) == (
        "test",
        "our reasoning: a guess",
    )


def test_ratio_claim_that_falls_short_says_what_it_needed(tmp_path):
    config = fixture_config()
    config["claims"][0]["at_least"] = 3.0
    tables = aggregate(write_fixture_metrics(tmp_path), config)
    assert tables["claims"]["sentence"][0] == (
        "patched copy recovers at least 2x throughput: does not hold here, a test "
        "of a bound from the study (2.81x, the claim needs at least 3x; 1 of 2 "
        "paired runs meet it; study 2.7x)"
    )


def test_within_claim_holds_for_close_arms(tmp_path):
    config = fixture_config()
    config["claims"] = [
        {
            "name": "cpu_alike",
            "kind": "within",
            "statement": "both arms use alike cgroup cores",
            "metric": "scheduler_cpu_percent",
            "arms": ["original", "patched"],
            "tolerance": 0.40,
            "min_valid_runs": 2,
            "bound_from": {"kind": "reasoning", "what": "cores follow requests"},
        }
    ]
    tables = aggregate(write_fixture_metrics(tmp_path), config)
    claim = tables["claims"].iloc[0]
    # Scheduler CPU medians: original 80, patched 105; 105 / 80 - 1 = 31.25%.
    assert claim["verdict"] == "holds"
    assert claim["value"] == pytest.approx(0.3125)


def test_crashed_run_counts_in_the_total_but_not_the_median(tmp_path):
    config = fixture_config()
    records = [json.loads(p.read_text()) for p in write_fixture_metrics(tmp_path)]
    records.append(
        failed_run_metrics(
            Arm.from_config(config["arms"][0]), 4, "server died at start"
        )
    )

    tables = tables_from_metrics(records, config)
    row = arm_row(tables, "original", "throughput_rps")
    assert (row["median"], row["n_valid"], row["n_total"]) == (1.6, 3, 4)
    invalid = tables["invalid_runs"]
    assert invalid[["arm", "run"]].values.tolist() == [["original", 4], ["patched", 3]]
    assert invalid["reasons"][0] == "server died at start"


def test_tables_survive_a_csv_round_trip(tables, tmp_path):
    paths = write_tables(tables, tmp_path / "tables")
    assert [path.name for path in paths] == [
        "runs.csv",
        "arms.csv",
        "ratios.csv",
        "invalid_runs.csv",
        "attempts.csv",
        "claims.csv",
    ]
    again = read_tables(tmp_path / "tables")
    for name, table in tables.items():
        assert list(again[name].columns) == list(table.columns)
        assert len(again[name]) == len(table)
    assert again["claims"]["sentence"].tolist() == tables["claims"]["sentence"].tolist()
    assert again["runs"]["valid"].tolist() == tables["runs"]["valid"].tolist()


# --- earlier attempts, and the node each run ran on ---------------------------------


def attempt_at(attempts: RunAttempts, metrics: dict, fixture_run: Path) -> None:
    """One attempt as the arm runner makes it: the run's files measured into the
    attempt's own folder (the fixture run's, with ``metrics``), then kept."""
    started = attempts.begin()
    paths = started.paths
    paths.metrics.write_text(json.dumps(metrics))
    shutil.copyfile(fixture_run / "requests.jsonl", paths.requests)
    shutil.copyfile(fixture_run / "monitors.json", paths.monitors)
    paths.provenance.write_text(json.dumps(node_record(describe_node())))
    paths.server_log.write_text("served\n")
    attempts.keep(started, metrics, waited_for_quiet_s=0)
    attempts.choose(started, metrics)


HOST_LOAD = "the host's other load was 1.6 cores"
SERVER_SLOW = "the server never became healthy"


def measured_three_times(study: Path, arm: str, run: int) -> None:
    """Run ``run`` of ``arm`` measured three times: an attempt the next one
    supersedes, the fixture's own (which becomes the run's), and one invalid for
    reasons outside the arm, after which the run keeps the fixture's."""
    directory = study / arm / f"run{run}"
    own = json.loads((directory / "metrics.json").read_text())
    # Figures far from the run's own: in a median, they would move it.
    superseded = own | {"throughput_rps": 100.0, "main_cpu_percent": 5.0}
    failed = own | {
        "valid": False,
        "outside_the_arm": True,
        "throughput_rps": 0.01,
        "invalid_reasons": [HOST_LOAD, SERVER_SLOW],
    }
    for metrics in (superseded, own, failed):  # each by a job of its own
        attempts = RunAttempts(
            root=study / "attempts" / arm / f"run{run}",
            outputs=RunPaths.in_directory(directory),
            listing=directory / "attempts.json",
            settings_sha256="a" * 64,
        )
        attempt_at(attempts, metrics, FIXTURE / "runs" / arm / f"run{run}")


def test_earlier_attempts_are_listed_and_enter_no_median(tmp_path):
    config = fixture_config()
    plain = aggregate_runs(write_fixture_metrics(tmp_path / "plain"), config)
    metrics = write_fixture_metrics(tmp_path / "study")
    measured_three_times(tmp_path / "study", "original", 2)

    tables = aggregate_runs(metrics, config)
    write_tables(tables, tmp_path / "tables")
    attempts = pd.read_csv(tmp_path / "tables" / "attempts.csv", keep_default_na=False)
    columns = ["arm", "run", "outcome", "valid", "throughput_rps", "reasons"]
    assert attempts[columns].to_dict("records") == [
        {
            "arm": "original",
            "run": 2,
            "outcome": "superseded",
            "valid": True,
            "throughput_rps": 100.0,
            "reasons": "",
        },
        {
            "arm": "original",
            "run": 2,
            "outcome": "failed outside the arm",
            "valid": False,
            "throughput_rps": 0.01,
            "reasons": f"{HOST_LOAD}; {SERVER_SLOW}",
        },
    ]
    listed = json.loads((tmp_path / "study/original/run2/attempts.json").read_text())
    assert [entry["outcome"] for entry in listed] == [
        "superseded",
        "current",
        "failed outside the arm",
    ]
    assert attempts["attempt"].tolist() == [listed[0]["attempt"], listed[2]["attempt"]]
    # The run is its current attempt: every table but the attempts is the same.
    for name in ("runs", "arms", "ratios", "invalid_runs", "claims"):
        pd.testing.assert_frame_equal(tables[name], plain[name])
    assert arm_row(tables, "original", "throughput_rps")["median"] == 1.6


def test_a_study_measured_once_writes_the_attempts_table_with_its_header(
    tables, tmp_path
):
    assert tables["attempts"].empty
    write_tables(tables, tmp_path)
    assert (tmp_path / "attempts.csv").read_text() == (
        "arm,run,attempt,outcome,valid,throughput_rps,reasons\n"
    )


def test_a_run_on_another_node_is_flagged_in_the_runs_table(tmp_path):
    metrics = write_fixture_metrics(tmp_path / "study")
    elsewhere = {"hostname": f"not-{platform.node()}"}
    hosts = {
        ("patched", "run1"): elsewhere,
        ("patched", "run2"): elsewhere | {"visible_cpus": 0},
    }
    for path in metrics:
        run = (path.parent.parent.name, path.parent.name)
        provenance = node_record(hosts.get(run, describe_node()))
        path.with_name("provenance.json").write_text(json.dumps(provenance))
    # A provenance written before runs recorded their node flags nothing.
    metrics[0].with_name("provenance.json").write_text(json.dumps({"wall_s": 9.0}))

    tables = aggregate_runs(metrics, fixture_config(), provenance=True)
    write_tables(tables, tmp_path / "tables")
    runs = pd.read_csv(tmp_path / "tables" / "runs.csv", keep_default_na=False)
    flags = zip(runs["arm"], runs["run"], runs["node_differs_from_host"], strict=True)
    assert list(flags) == [
        ("original", 1, ""),
        ("original", 2, ""),
        ("original", 3, ""),
        ("patched", 1, "hostname"),
        ("patched", 2, "hostname,visible_cpus"),
        ("patched", 3, ""),
    ]
    # A flag is no reason to drop a run.
    assert arm_row(tables, "patched", "throughput_rps")["n_valid"] == 2


def test_a_runs_files_out_of_order_are_refused(tmp_path):
    metrics = write_fixture_metrics(tmp_path)
    with pytest.raises(ValueError, match="is not beside"):
        aggregate(
            metrics,
            fixture_config(),
            attempts_paths=beside(list(reversed(metrics)), "attempts.json"),
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"metric": "speed"}, "uses metric 'speed'"),
        ({"numerator": "missing_arm"}, "names arms \\['missing_arm'\\]"),
        ({"at_least": None}, "needs numerator, denominator and at least one"),
    ],
)
def test_malformed_claims_are_named(change, message):
    config = fixture_config()
    config["claims"][0].update(change)
    with pytest.raises(ValueError, match=message):
        tables_from_metrics([], config)


def test_reference_for_an_unknown_arm_is_refused():
    config = fixture_config()
    config["reference"]["arms"][0]["arm"] = "Z"
    with pytest.raises(ValueError, match="reference.arms names arm 'Z'"):
        tables_from_metrics([], config)


SCHEMA = Path(__file__).resolve().parents[1] / "config/schema/config.schema.yaml"


def schema_for_claims() -> dict:
    """The config schema's own claims and reference rules, with its definitions."""
    schema = yaml.safe_load(SCHEMA.read_text())
    properties = schema["properties"]
    return {
        "type": "object",
        "$defs": schema["$defs"],
        "properties": {
            "claims": properties["claims"],
            "reference": properties["reference"],
        },
    }


def test_fixture_config_matches_the_schema():
    jsonschema.validate(fixture_config(), schema_for_claims())


def test_the_schema_names_exactly_the_run_figures():
    metrics = yaml.safe_load(SCHEMA.read_text())["$defs"]["metric"]["enum"]
    assert metrics == list(METRICS)


@pytest.mark.parametrize("metric", ["main_cpu_ms_per_request", "torch_threads"])
def test_a_claim_and_a_reference_may_use_any_run_figure(metric):
    config = copy.deepcopy(fixture_config())
    config["claims"][0]["metric"] = metric
    config["reference"]["arms"][0][metric] = 1.0
    jsonschema.validate(config, schema_for_claims())


@pytest.mark.parametrize("where", ["claim", "reference"])
def test_a_figure_no_run_reports_is_refused(where):
    config = copy.deepcopy(fixture_config())
    if where == "claim":
        config["claims"][0]["metric"] = "throughput"
    else:
        config["reference"]["arms"][0]["throughput"] = 1.0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, schema_for_claims())


STUDY_BOUND = {"kind": "study", "what": "the study's ratio"}


def ratio_claim(**fields) -> dict:
    return {
        "name": "c",
        "statement": "s",
        "bound_from": STUDY_BOUND,
        "metric": "throughput_rps",
        "numerator": "patched",
        "denominator": "original",
    } | fields


def within_claim(**fields) -> dict:
    return {
        "name": "c",
        "kind": "within",
        "statement": "s",
        "bound_from": STUDY_BOUND,
        "metric": "throughput_rps",
        "arms": ["original", "patched"],
    } | fields


@pytest.mark.parametrize(
    ("broken", "rule", "complete"),
    [
        (ratio_claim(), "anyOf", ratio_claim(at_least=2)),  # no bound
        (within_claim(), "required", within_claim(tolerance=0.1)),
        (  # a misspelled second bound beside a good one
            ratio_claim(at_least=2, at_mots=0.5),
            "additionalProperties",
            ratio_claim(at_least=2, at_most=0.5),
        ),
    ],
    ids=["no-bound", "no-tolerance", "misspelled-key"],
)
def test_the_schema_rejects_incomplete_claims(broken, rule, complete):
    """Each claim is refused by the rule that names what it lacks, and taken once
    that is given."""
    config = copy.deepcopy(fixture_config())
    config["claims"] = [broken]
    with pytest.raises(jsonschema.ValidationError) as refused:
        jsonschema.validate(config, schema_for_claims())
    assert (refused.value.validator, list(refused.value.absolute_path)) == (
        rule,
        ["claims", 0],
    )
    config["claims"] = [complete]
    jsonschema.validate(config, schema_for_claims())
