"""The report's figure of one run per arm over time, built from the published runs
of docs/results/embedded-b1 (and, for an even count of runs, sglang-cpu): which run
is drawn, where its time axis starts, and that its series agree with the requests'
log and the monitors' own counters."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from serving_study.analysis.aggregate import read_tables
from serving_study.analysis.run_timelines import (
    BIN_SECONDS,
    MAIN_CPU,
    REPRESENTATIVE_RUNS,
    RUN_TIMELINES,
    THROTTLED,
    TTFT,
    run_timelines,
)
from serving_study.measure.request_log import completed, measured, read_request_log
from serving_study.report.run_timeline_chart import run_timelines_chart
from serving_study.report.settings import ReportSettings

ROOT = Path(__file__).parent.parent
EMBEDDED = ROOT / "docs" / "results" / "embedded-b1"
SGLANG_CPU = ROOT / "docs" / "results" / "sglang-cpu"


def page_timelines(page: Path, config: str, runs: pd.DataFrame | None = None):
    settings = ReportSettings.from_config(
        {"engine": "embedded"} | yaml.safe_load((ROOT / config).read_text())
    )
    if runs is None:
        runs = read_tables(page / "tables")["runs"]
    found = run_timelines(
        runs,
        settings.arm_names,
        sorted(page.glob("runs/*/run*/requests.jsonl")),
        sorted(page.glob("runs/*/run*/monitors.json")),
    )
    return found, settings


@pytest.fixture(scope="module")
def embedded():
    return page_timelines(EMBEDDED, "config/config.yaml")


def test_each_arms_drawn_run_is_its_median_valid_run(embedded):
    (found, settings), runs = embedded, read_tables(EMBEDDED / "tables")["runs"]
    chosen = found[REPRESENTATIVE_RUNS].set_index("arm")
    assert list(chosen.index) == settings.arm_names
    for arm, row in chosen.iterrows():
        valid = runs[(runs["arm"] == arm) & runs["valid"]]
        median = valid["throughput_rps"].median()
        (run,) = valid.loc[valid["throughput_rps"] == median, "run"]
        assert row["run"] == run
        assert row["chosen_because"] == (
            f"run {run}: {median:.3g} req/s, the median of {len(valid)} valid runs"
        )


def test_with_two_runs_the_earlier_of_the_two_nearest_is_drawn():
    found, _ = page_timelines(SGLANG_CPU, "config/sglang-cpu.yaml")
    chosen = found[REPRESENTATIVE_RUNS]
    assert set(chosen["valid_runs"]) == {2}
    assert set(chosen["run"]) == {1}
    assert all("nearest the median" in why for why in chosen["chosen_because"])


def test_an_arm_without_a_valid_run_is_not_drawn_and_says_so(embedded):
    runs = read_tables(EMBEDDED / "tables")["runs"]
    runs.loc[runs["arm"] == "C", "valid"] = False
    found, settings = page_timelines(EMBEDDED, "config/config.yaml", runs)
    row = found[REPRESENTATIVE_RUNS].set_index("arm").loc["C"]
    assert pd.isna(row["run"])
    assert row["chosen_because"] == "no valid run of 3: nothing drawn"
    assert "C" not in set(found[RUN_TIMELINES]["arm"])
    spec = run_timelines_chart(
        found[REPRESENTATIVE_RUNS], found[RUN_TIMELINES], settings.arms
    )
    note = spec["vconcat"][0]["hconcat"][1]
    assert written(note, spec) == ["C (patched): no valid run of 3: nothing drawn"]


def series_of(found: dict, arm: str, name: str) -> pd.DataFrame:
    chosen = found[REPRESENTATIVE_RUNS].set_index("arm").loc[arm, "run"]
    timelines = found[RUN_TIMELINES]
    return timelines[
        (timelines["arm"] == arm)
        & (timelines["run"] == chosen)
        & (timelines["series"] == name)
    ], EMBEDDED / "runs" / arm / f"run{chosen}"


def test_ttft_is_every_completed_measured_request_from_the_windows_start(embedded):
    found, _ = embedded
    ttft, folder = series_of(found, "A", TTFT)
    records = measured(read_request_log(folder / "requests.jsonl"))
    assert ttft["t_s"].min() == 0
    assert len(ttft) == sum(map(completed, records)) == 160
    assert sorted(ttft["value"]) == sorted(record[TTFT] for record in records)
    metrics = json.loads((folder / "metrics.json").read_text())
    assert ttft["value"].median() == pytest.approx(metrics["ttft_p50_ms"])
    # The last request was sent within the measured window the monitors saw.
    window = json.loads((folder / "monitors.json").read_text())["window"]
    assert ttft["t_s"].max() < window["wall_seconds"]


@pytest.mark.parametrize("arm", ["A", "C", "A-free"])
def test_monitor_series_agree_with_the_monitors_counters(embedded, arm):
    found, _ = embedded
    cpu, folder = series_of(found, arm, MAIN_CPU)
    throttled, _ = series_of(found, arm, THROTTLED)
    monitors = json.loads((folder / "monitors.json").read_text())
    # Bins of BIN_SECONDS from the window's start, drawn at their middles.
    assert cpu["t_s"].iloc[0] == BIN_SECONDS / 2
    assert (cpu["t_s"].diff().dropna() == BIN_SECONDS).all()
    assert len(cpu) == math.ceil(monitors["series"][-1]["t"] / BIN_SECONDS)
    assert cpu["value"].mean() == pytest.approx(monitors["main_cpu_percent"], rel=0.03)
    share = monitors["cgroup"]["throttled_share"]
    if share is None:  # no quota: no period, nothing throttled to draw
        assert throttled.empty
        return
    assert throttled["value"].between(0, 1).all()
    assert throttled["value"].mean() == pytest.approx(share, abs=0.02)


def test_the_original_and_the_patched_copy_sit_side_by_side(embedded):
    found, settings = embedded
    spec = run_timelines_chart(
        found[REPRESENTATIVE_RUNS], found[RUN_TIMELINES], settings.arms
    )
    rows = [[cell.get("title") for cell in row["hconcat"]] for row in spec["vconcat"]]
    because = found[REPRESENTATIVE_RUNS].set_index("arm")["chosen_because"]
    assert rows[0] == [f"A (original): {because['A']}", f"C (patched): {because['C']}"]
    assert rows[1] == [f"B (original): {because['B']}", f"D (patched): {because['D']}"]
    assert rows[-1][1] == f"C-free (patched): {because['C-free']}"
    (passive, note) = spec["vconcat"][2]["hconcat"]
    assert passive["title"].startswith("A-passive (original): run ")
    assert written(note, spec) == ["no patched arm with these settings"]
    # One time axis for every panel, from the window's start.
    domains = {
        json.dumps(panel["encoding"]["x"]["scale"]["domain"])
        for panel in panels_in(spec)
    }
    assert len(domains) == 1 and json.loads(domains.pop())[0] == 0
    # The page keeps what the chart draws: A's TTFT is its run's, to 0.1 ms.
    datasets = spec["datasets"]
    ttft, _ = series_of(found, "A", TTFT)
    drawn = [
        sorted(point["value"] for point in datasets[name])
        for name in datasets
        if len(datasets[name]) == len(ttft)
    ]
    assert sorted(ttft["value"].round(1)) in drawn
    assert len(json.dumps(spec)) < 100_000


def panels_in(spec):
    """Every panel that draws a series (the notes have no axes)."""
    if "x" in spec.get("encoding", {}):
        yield spec
    for key in ("vconcat", "hconcat"):
        for part in spec.get(key, []):
            yield from panels_in(part)


def written(cell: dict, spec: dict) -> list[str]:
    """The sentences a note cell writes, from the spec's datasets."""
    return [row["text"] for row in spec["datasets"][cell["data"]["name"]]]


def test_the_docs_quote_arm_as_drawn_run(embedded):
    found, _ = embedded
    because = found[REPRESENTATIVE_RUNS].set_index("arm").loc["A", "chosen_because"]
    text = " ".join((ROOT / "docs" / "reading-results.md").read_text().split())
    assert f'"A (original): {because}"' in text
