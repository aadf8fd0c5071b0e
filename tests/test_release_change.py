"""The change criterion, the releases table, the release figure and the release config.

The criterion and table tests feed hand-made runs through the real aggregation
(metrics records -> runs -> arms tables), so they check the criterion where the
report applies it. The release config is the shipped config/bisect.yaml.
"""

import copy
import itertools
import json
import math
from pathlib import Path

import pytest
import yaml

from serving_study.analysis.aggregate import (
    read_tables,
    tables_from_metrics,
    write_tables,
)
from serving_study.analysis.release_change import (
    CANNOT_TELL,
    CHANGED,
    NO_CHANGE,
    ChangeCriterion,
    Spread,
    compare,
    describe_first_change,
    false_alarm_chance,
    first_change,
    release_labels,
    series_false_alarm_bound,
)
from serving_study.config.validation import ConfigError, check_config
from serving_study.engine.shm_loader import load_variant_transport
from serving_study.report.page import build_report
from serving_study.report.settings import ReportSettings
from serving_study.sources.fetch import fetch_source

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema" / "config.schema.yaml"
BISECT_CONFIG = ROOT / "config" / "bisect.yaml"
REPORT_FIXTURE = Path(__file__).parent / "fixtures" / "report"


def spread(*values: float) -> Spread:
    return Spread.of_values(values)


# --- the criterion ----------------------------------------------------------------


def test_ranges_apart_and_a_large_enough_ratio_is_a_change():
    result = compare(spread(10, 10.2, 10.4), spread(7.0, 7.1, 7.3), ChangeCriterion())
    assert result.verdict == CHANGED
    assert result.ratio == pytest.approx(7.1 / 10.2)


def test_overlapping_ranges_are_no_change_however_far_the_medians():
    # One slow run of the later release reaches into the earlier one's range.
    result = compare(spread(10, 10.2, 10.4), spread(7.0, 7.1, 10.1), ChangeCriterion())
    assert result.verdict == NO_CHANGE
    assert "overlap" in result.detail


def test_ranges_apart_but_below_the_smallest_change_are_no_change():
    earlier, later = spread(10.0, 10.05, 10.1), spread(10.3, 10.35, 10.4)
    assert compare(earlier, later, ChangeCriterion(min_change=0.05)).verdict == (
        NO_CHANGE
    )
    assert compare(earlier, later, ChangeCriterion(min_change=0.02)).verdict == (
        CHANGED
    )


def test_a_rise_counts_like_a_fall_of_the_same_factor():
    criterion = ChangeCriterion(min_change=0.25)
    assert compare(spread(8, 8, 8), spread(10, 10, 10), criterion).changed
    assert compare(spread(10, 10, 10), spread(8, 8, 8), criterion).changed
    assert not compare(spread(10, 10, 10), spread(8.1, 8.1, 8.1), criterion).changed


def test_too_few_valid_runs_cannot_tell():
    result = compare(spread(10, 10.1), spread(5, 5.1, 5.2), ChangeCriterion())
    assert result.verdict == CANNOT_TELL
    assert math.isnan(result.ratio)


def test_false_alarm_chance_is_the_share_of_orderings_whose_ranges_fall_apart():
    # Exchangeable runs: every assignment of 2n distinct values to the two
    # versions is equally likely; count those whose ranges do not overlap.
    for before, after in ((3, 3), (4, 4), (3, 5)):
        values = range(before + after)
        apart = total = 0
        for chosen in itertools.combinations(values, before):
            rest = [value for value in values if value not in chosen]
            total += 1
            apart += max(chosen) < min(rest) or max(rest) < min(chosen)
        assert false_alarm_chance(before, after) == pytest.approx(apart / total)
    assert false_alarm_chance(3, 3) == pytest.approx(0.1)


# --- the releases table, through the real aggregation ------------------------------


def release_config(versions: list[str]) -> dict:
    return {
        "experiment": "series",
        "engine": "embedded",
        "release_series": True,
        "change_criterion": {"metric": "throughput_rps", "min_change": 0.05},
        "sources": [
            {"name": f"s{v}", "pypi": {"package": "sglang", "version": v}}
            for v in versions
        ],
        "variants": [{"name": f"v{v}", "source": f"s{v}"} for v in versions],
        "arms": [
            {
                "name": f"arm-{index}",
                "variant": f"v{v}",
                "workload": "w",
                "cpu_quota": 0.21,
                "concurrency": 1,
                "requests": 4,
            }
            for index, v in enumerate(versions)
        ],
        "claims": [],
    }


def run_record(arm: str, run: int, throughput: float, cpu: float, valid=True):
    return {
        "arm": arm,
        "run": run,
        "valid": valid,
        "invalid_reasons": [] if valid else ["server never healthy"],
        "throughput_rps": throughput if valid else None,
        "main_cpu_percent": cpu if valid else None,
    }


# Throughput and main-process CPU per release, three runs each.
SERIES = {
    "0.5.9": ([6.4, 6.5, 6.3], [16.0, 16.5, 17.0]),
    "0.5.10": ([6.5, 6.35, 6.45], [16.2, 16.4, 16.9]),  # alike
    "0.5.11": ([4.9, 5.0, 5.1], [15.8, 16.6, 16.8]),  # throughput falls
    "0.5.12": ([5.0, 4.8, 5.05], [25.0, 26.0, 24.5]),  # CPU rises
}


def series_tables(series=SERIES, broken: str | None = None) -> dict:
    config = release_config(list(series))
    records = []
    for index, (throughputs, cpus) in enumerate(series.values()):
        arm = f"arm-{index}"
        for run, (throughput, cpu) in enumerate(
            zip(throughputs, cpus, strict=True), start=1
        ):
            valid = arm != broken
            records.append(run_record(arm, run, throughput, cpu, valid))
    return tables_from_metrics(records, config), config


def test_releases_table_marks_the_first_change_of_each_figure():
    tables, _ = series_tables()
    releases = tables["releases"]
    throughput = releases[releases["metric"] == "throughput_rps"]
    assert throughput["release"].tolist() == ["0.5.9", "0.5.10", "0.5.11", "0.5.12"]
    assert throughput["verdict"].isna().tolist() == [True, False, False, False]
    assert throughput["verdict"].tolist()[1:] == [NO_CHANGE, CHANGED, NO_CHANGE]
    assert first_change(releases, "throughput_rps")["release"] == "0.5.11"
    assert first_change(releases, "main_cpu_percent")["release"] == "0.5.12"
    assert (
        throughput["block_ratios"].tolist()[2] == "run1 0.754; run2 0.787; run3 0.791"
    )
    sentence = describe_first_change(releases, "throughput_rps")
    # Three comparisons of 3 runs against 3, each apart by chance in 10%.
    assert sentence == (
        "throughput first changed in 0.5.11: 0.775x the median of 0.5.10, ranges "
        "[6.35, 6.5] then [4.9, 5.1] apart. Over the series' 3 comparisons, "
        "releases that all perform alike would show a change somewhere by chance "
        "in at most 30% of series."
    )


def test_a_release_without_valid_runs_is_skipped_not_compared():
    tables, _ = series_tables(broken="arm-1")
    releases = tables["releases"]
    throughput = releases[releases["metric"] == "throughput_rps"].set_index("release")
    assert throughput.loc["0.5.10", "verdict"] == CANNOT_TELL
    # 0.5.11 is compared with the last release that was measured.
    assert throughput.loc["0.5.11", "compared_with"] == "0.5.9"
    assert throughput.loc["0.5.11", "first_change"]
    # A release that could not be compared adds no chance of a false alarm.
    assert series_false_alarm_bound(releases, "throughput_rps") == (
        2,
        pytest.approx(0.2),
    )


def test_no_change_anywhere_says_so():
    alike = {version: SERIES["0.5.9"] for version in ("0.5.9", "0.5.10", "0.5.11")}
    tables, _ = series_tables(alike)
    assert first_change(tables["releases"], "throughput_rps") is None
    assert describe_first_change(tables["releases"], "throughput_rps") == (
        "No release changed throughput beyond the run-to-run spread. Over the "
        "series' 2 comparisons, releases that all perform alike would show a change "
        "somewhere by chance in at most 20% of series."
    )


def test_releases_table_is_written_and_read_back_only_for_a_series(tmp_path):
    tables, config = series_tables()
    write_tables(tables, tmp_path / "series")
    again = read_tables(tmp_path / "series")["releases"]
    written = tables["releases"]
    for column in ("release", "arm", "metric", "verdict", "first_change"):
        assert again[column].fillna("").tolist() == written[column].fillna("").tolist()
    assert again["median"].tolist() == pytest.approx(written["median"].tolist())

    config["release_series"] = False
    plain = tables_from_metrics(
        [run_record("arm-0", 1, 6.0, 16.0)], config | {"arms": config["arms"][:1]}
    )
    assert "releases" not in plain
    write_tables(plain, tmp_path / "plain")
    assert not (tmp_path / "plain" / "releases.csv").exists()


def test_release_labels_come_from_each_arms_source():
    config = release_config(["0.5.9", "0.5.10"])
    config["sources"][1] = {"name": "s0.5.10", "git": {"url": "x", "commit": "ab" * 20}}
    assert release_labels(config) == [("arm-0", "0.5.9"), ("arm-1", "abababababab")]


# --- the report -------------------------------------------------------------------


def test_report_plots_the_series_and_marks_the_first_change(tmp_path):
    tables, config = series_tables()
    host = json.loads((REPORT_FIXTURE / "host.json").read_text())
    page = tmp_path / "report.html"
    settings = ReportSettings.from_config(config)
    written = build_report(tables, settings, host, [], page, tmp_path / "figures")

    assert tmp_path / "figures" / "release_series.html" in written
    assert tmp_path / "figures" / "table_releases.html" in written
    html = page.read_text()
    assert 'id="figure-release_series"' in html
    assert "throughput first changed in 0.5.11" in html
    assert "main-process CPU first changed in 0.5.12" in html
    spec = json.loads((tmp_path / "figures" / "release_series.vl.json").read_text())
    panels = spec["vconcat"]
    assert [panel["title"] for panel in panels] == ["throughput", "main-process CPU"]
    markers = [
        next(iter(dataset))["text"]
        for dataset in _datasets_with_key(spec, "text").values()
    ]
    assert any(text.startswith("first change: 0.5.11") for text in markers)
    assert any(text.startswith("first change: 0.5.12") for text in markers)


def test_report_of_an_experiment_that_is_no_series_has_no_release_figure(tmp_path):
    tables, config = series_tables()
    config["release_series"] = False
    host = json.loads((REPORT_FIXTURE / "host.json").read_text())
    page = tmp_path / "report.html"
    settings = ReportSettings.from_config(config)
    written = build_report(tables, settings, host, [], page, tmp_path / "figures")
    assert not any("release" in path.name for path in written)
    assert "figure-release_series" not in page.read_text()


def _datasets_with_key(spec: dict, key: str) -> dict:
    return {
        name: rows
        for name, rows in spec.get("datasets", {}).items()
        if rows and key in rows[0]
    }


# --- the release config -------------------------------------------------------------


def load_bisect_config() -> dict:
    return yaml.safe_load(BISECT_CONFIG.read_text())


def test_bisect_config_lists_every_release_from_0_5_9_in_order_at_the_study_ratio():
    config = check_config(load_bisect_config(), SCHEMA, [str(BISECT_CONFIG)], ROOT)
    labels = [label for _, label in release_labels(config)]
    assert labels[0] == "0.5.9" and labels[-1] == "0.5.23"
    assert len(labels) == len(set(labels)) == 19
    assert config["release_series"] is True
    for arm in config["arms"]:
        assert arm["runs"] >= 3
        # The study: 128 intra-op threads under 13.6 cores; here 2 threads.
        assert 2 / arm["cpu_quota"] == pytest.approx(128 / 13.6, rel=0.02)


def test_releases_out_of_order_are_refused():
    config = load_bisect_config()
    config["arms"][1], config["arms"][2] = config["arms"][2], config["arms"][1]
    with pytest.raises(ConfigError, match=r"arms\[2\]: release 0.5.10 comes after"):
        check_config(config, SCHEMA, ["bad.yaml"], ROOT)


def test_unknown_criterion_metric_is_refused():
    config = load_bisect_config()
    config["change_criterion"]["metric"] = "speed"
    with pytest.raises(ConfigError, match=r"change_criterion.metric: 'speed'"):
        check_config(copy.deepcopy(config), SCHEMA, ["bad.yaml"], ROOT)


@pytest.mark.slow
@pytest.mark.network
def test_every_release_of_the_config_loads_in_the_embedded_engine(
    tmp_path, pytestconfig
):
    """Fetch each release from PyPI and compile its own ShmPointerMMData."""
    config = load_bisect_config()
    wheels = pytestconfig.cache.mkdir("sglang-wheels")
    receive_paths = {}
    for source in config["sources"]:
        tree = tmp_path / source["name"]
        fetch_source(source, tree, download_dir=wheels)
        transport = load_variant_transport(tree / "python")
        receive_paths[source["pypi"]["version"]] = transport.materializes
    assert receive_paths.pop("0.5.9") is False  # clone-and-unlink on receive
    assert all(receive_paths.values())  # 0.5.10 onward: materialize()
