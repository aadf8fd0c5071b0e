"""The "which fix" table and section, from the hand-checked report fixture
(tests/fixtures/report/README.md works every number out)."""

import copy
from pathlib import Path

import pytest
import yaml
from test_aggregate import fixture_config, write_fixture_metrics

from serving_study.analysis.aggregate import aggregate, read_tables, write_tables
from serving_study.analysis.fix_comparison import FIXES_TABLE, TRAP
from serving_study.config.section_checks import fixes_problems
from serving_study.report.page import build_report
from serving_study.report.settings import ReportSettings

FIXES = {
    "baseline": {"arm": "original"},
    "fixes": [{"name": "patch (PR #48881)", "arm": "patched"}],
}


def config_with_fixes() -> dict:
    config = fixture_config()
    config["fixes"] = copy.deepcopy(FIXES)
    return config


@pytest.fixture
def fixes(tmp_path):
    tables = aggregate(write_fixture_metrics(tmp_path / "runs"), config_with_fixes())
    return tables[FIXES_TABLE].set_index("fix")


def test_each_fix_stands_beside_the_trap_with_its_medians(fixes):
    assert list(fixes.index) == [TRAP, "patch (PR #48881)"]
    trap, patch = fixes.loc[TRAP], fixes.loc["patch (PR #48881)"]
    assert trap["throughput_rps"] == pytest.approx(1.6)
    assert patch["throughput_rps"] == pytest.approx(4.5)
    assert patch["throughput_vs_trap"] == pytest.approx(4.5 / 1.6)
    assert trap["throughput_vs_trap"] == pytest.approx(1.0)
    assert patch["ttft_p50_ms"] == pytest.approx(55)
    # Main CPU per request: 150%/2.0, 190%/1.0 and 170%/1.6 req/s for the trap
    # (median 1062.5 ms); 40%/4.0 and 60%/5.0 for the patch (median 110 ms).
    assert trap["main_cpu_ms_per_request"] == pytest.approx(1062.5)
    assert patch["main_cpu_ms_per_request"] == pytest.approx(110)


def test_a_fix_carries_the_verdicts_of_its_claims(fixes):
    verdicts = fixes.loc["patch (PR #48881)", "verdicts"]
    assert verdicts.startswith("patch_recovers_throughput: holds (2.81x")
    # A ratio claim belongs to its numerator; a "within" claim to each of its arms.
    assert "ttft_alike: does not hold" in verdicts
    assert fixes.loc[TRAP, "verdicts"].startswith("ttft_alike: does not hold")
    assert "patch_recovers_throughput" not in fixes.loc[TRAP, "verdicts"]


def test_cost_without_a_quota_is_not_measured_without_its_arm(fixes):
    assert fixes["without_quota_arm"].isna().all()
    assert fixes["main_cpu_ms_per_request_without_quota"].isna().all()


def test_the_report_shows_the_section_and_its_figure(tmp_path):
    config = config_with_fixes()
    tables = aggregate(write_fixture_metrics(tmp_path / "runs"), config)
    write_tables(tables, tmp_path / "tables")
    read_back = read_tables(tmp_path / "tables")
    assert FIXES_TABLE in read_back
    page = tmp_path / "report.html"
    settings = ReportSettings.from_config(config | {"engine": "embedded"})
    written = build_report(read_back, settings, {}, [], page, tmp_path / "figures")
    html = page.read_text()
    assert "Which fix: throughput, latency and CPU cost of each" in html
    assert "not measured" in html
    assert "patch_recovers_throughput: holds" in html
    assert tmp_path / "figures" / "which_fix.vl.json" in written
    assert tmp_path / "figures" / "table_fixes.html" in written


def test_an_experiment_without_fixes_has_no_such_table(tmp_path):
    tables = aggregate(write_fixture_metrics(tmp_path), fixture_config())
    assert FIXES_TABLE not in tables


@pytest.mark.parametrize(
    "fixes, problem",
    [
        (
            {"baseline": {"arm": "Z"}, "fixes": [{"name": "f", "arm": "patched"}]},
            "fixes.baseline.arm: 'Z' names no arm",
        ),
        (
            {
                "baseline": {"arm": "original", "without_quota": "patched"},
                "fixes": [{"name": "f", "arm": "patched"}],
            },
            "fixes.baseline.without_quota: arm 'patched' runs under a quota (2.0)",
        ),
        (
            {"baseline": {"arm": "original"}, "fixes": [{"name": "f", "arm": "slow"}]},
            "fixes.fixes[0].arm: arm 'slow' runs under quota 1.0, the baseline under "
            "2.0",
        ),
    ],
)
def test_fixes_that_compare_unlike_arms_are_refused(fixes, problem):
    arms = fixture_config()["arms"] + [{"name": "slow", "cpu_quota": 1.0}]
    assert any(problem in found for found in fixes_problems(fixes, arms))


def test_every_shipped_fixes_section_names_like_arms():
    root = Path(__file__).resolve().parents[1]
    shipped = [
        yaml.safe_load(path.read_text())
        for path in sorted((root / "config").glob("*.yaml"))
    ]
    with_fixes = [config for config in shipped if "fixes" in config]
    assert with_fixes, "the default experiment carries a fixes section"
    for config in with_fixes:
        assert fixes_problems(config["fixes"], config["arms"]) == []
