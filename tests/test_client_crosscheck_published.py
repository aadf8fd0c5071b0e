"""The published client cross-check: docs/harness-performance.md and the results
page quote what the workflow wrote, and every run they stand on counts."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from serving_study.analysis.numbers import format_number
from serving_study.studies.bench_serving_result import DETAIL_KEYS, RESULT_KEYS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "client-crosscheck"
HARNESS = ROOT / "docs" / "harness-performance.md"
EXPERIMENTS = ("crosscheck-embedded", "crosscheck-sglang-cpu")
CLIENTS = ("ours", "bench_serving")


def tables(experiment: str) -> tuple[pd.Series, pd.DataFrame]:
    folder = PAGE / experiment / "tables"
    summary = pd.read_csv(folder / "client_crosscheck.csv").iloc[0]
    return summary, pd.read_csv(folder / "client_crosscheck_runs.csv")


def pair_ratios(runs: pd.DataFrame) -> list[float]:
    by_client = {
        client: runs[runs["client"] == client].set_index("pair")["throughput_rps"]
        for client in ("ours", "bench_serving")
    }
    return list((by_client["ours"] / by_client["bench_serving"]).sort_index())


def expected_row(experiment: str) -> list[str]:
    """The harness page's row for ``experiment``, from its published tables."""
    summary, runs = tables(experiment)

    def side_by_side(name: str) -> str:
        ours = format_number(summary[f"ours_{name}"])
        return f"{ours} / {format_number(summary[f'bench_serving_{name}'])}"

    return [
        f"`{experiment}`",
        summary["arm"],
        f"{summary['valid_pairs']} of {summary['pairs']}",
        format_number(summary["ours_throughput_rps"]),
        format_number(summary["bench_serving_throughput_rps"]),
        f"{summary['ratio']:.3f}",
        f"**{summary['verdict']}**",
        ", ".join(f"{ratio:.3f}" for ratio in pair_ratios(runs)),
        side_by_side("ttft_p50_ms"),
        side_by_side("ttft_p99_ms"),
        side_by_side("client_cpu_ms_per_request"),
    ]


def table_rows(text: str, first_cell: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith(f"| {first_cell}")
    ]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_the_harness_page_quotes_the_published_tables(experiment):
    (row,) = table_rows(HARNESS.read_text(), f"`{experiment}`")
    assert row == expected_row(experiment)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_published_pair_counts_and_its_table_is_its_runs(experiment):
    """Each pair's two runs are valid, the runs table holds their figures, and
    bench_serving's row is its own result file's."""
    summary, runs = tables(experiment)
    assert runs["valid"].all() and summary["valid_pairs"] == summary["pairs"]
    for row in runs.to_dict("records"):
        pair = PAGE / experiment / "pairs" / f"pair{row['pair']}"
        metrics = json.loads((pair / row["client"] / "metrics.json").read_text())
        assert metrics["valid"] and metrics["throughput_rps"] == pytest.approx(
            row["throughput_rps"]
        )
        if row["client"] == "bench_serving":
            result = json.loads(
                (pair / "bench_serving" / "bench_serving.json").read_text()
            )
            assert list(result) == [*RESULT_KEYS, *DETAIL_KEYS]
            assert result["request_throughput"] == pytest.approx(row["throughput_rps"])
            assert result["completed"] == row["requests_completed"]
    ratios = pair_ratios(runs)
    assert summary["ratio"] == pytest.approx(float(np.median(ratios)))


def test_the_exported_run_is_in_bench_servings_format():
    exported = PAGE / "crosscheck-embedded" / "C-run1-bench_serving.json"
    result = json.loads(exported.read_text())
    assert list(result) == [*RESULT_KEYS, *DETAIL_KEYS]
    assert result["completed"] == 480 and result["max_concurrency"] == 16


def test_the_results_page_quotes_its_verdicts():
    text = " ".join((PAGE / "README.md").read_text().split())
    for experiment in EXPERIMENTS:
        summary, runs = tables(experiment)
        ratios = pair_ratios(runs)
        assert (
            f"{summary['arm']}: ratio {summary['ratio']:.3f} "
            f"({min(ratios):.3f} to {max(ratios):.3f}), {summary['verdict']}"
        ) in text, experiment
    assert re.search(r"\| pair \| client \|", (PAGE / "README.md").read_text())


def run_row(row: dict) -> list[str]:
    figures = ("throughput_rps", "ttft_p50_ms", "ttft_p99_ms")
    figures += ("main_cpu_ms_per_request", "client_cpu_ms_per_request")
    ran = "first" if row["order"] == 1 else "second"
    return [
        str(row["pair"]),
        row["client"],
        ran,
        *(format_number(row[name]) for name in (*figures, "host_other_cores")),
    ]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_the_results_page_lists_every_run_as_its_table_holds_it(experiment):
    text = (PAGE / "README.md").read_text()
    heading = {"crosscheck-embedded": "### The embedded engine"}.get(
        experiment, "### The real server on CPU"
    )
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    rows = [row for row in table_rows(section, "") if row[0].isdigit()]
    _, runs = tables(experiment)
    assert rows == [run_row(row) for row in runs.to_dict("records")]
    # Every run at its first attempt, in the window the page names.
    assert (runs["attempts"] == 1).all()
    provenance = [
        json.loads(path.read_text())
        for path in (PAGE / experiment / "pairs").glob("*/*/provenance.json")
    ]
    started = min(record["started_at"] for record in provenance)[11:19]
    finished = max(record["finished_at"] for record in provenance)[11:19]
    assert f"{experiment}.yaml # runs {started}-{finished} UTC" in " ".join(
        text.split()
    )


def test_the_findings_quote_the_tables():
    """The figures in the harness page's sentences about each experiment."""
    text = " ".join(HARNESS.read_text().split())
    embedded, embedded_runs = tables("crosscheck-embedded")
    ratios = pair_ratios(embedded_runs)
    assert f"every pair within {max(abs(r - 1) for r in ratios):.1%}" in text
    # bench_serving's first `concurrency` requests go at once to an idle server.
    ours, theirs = [], []
    for pair in sorted((PAGE / "crosscheck-embedded" / "pairs").iterdir()):
        result = json.loads((pair / "bench_serving" / "bench_serving.json").read_text())
        theirs.append(np.percentile(np.array(result["ttfts"][16:]) * 1000, 99))
        lines = (pair / "ours" / "requests.jsonl").read_text().splitlines()
        records = sorted(
            (json.loads(line) for line in lines), key=lambda record: record["index"]
        )
        measured = [r["ttft_ms"] for r in records if r["phase"] == "measured"]
        ours.append(np.percentile(measured[16:], 99))
    assert (
        f"its p99 is {format_number(np.median(theirs))} ms against our "
        f"{format_number(np.median(ours))}"
    ) in text
    cpu = [format_number(embedded[f"{c}_client_cpu_ms_per_request"]) for c in CLIENTS]
    assert f"It used {cpu[1]} ms of CPU per request to our {cpu[0]}" in text
    real, real_runs = tables("crosscheck-sglang-cpu")
    assert (real_runs["throttled_share"] >= 0.99).all()
    assert all(ratio > 1 for ratio in pair_ratios(real_runs))
    main_cpu = real_runs.pivot(
        index="pair", columns="client", values="main_cpu_ms_per_request"
    )
    assert (main_cpu["bench_serving"] > main_cpu["ours"]).all()
    assert (
        f"cost it more: {format_number(real['bench_serving_main_cpu_ms_per_request'])}"
        f" ms each against {format_number(real['ours_main_cpu_ms_per_request'])}"
    ) in text
    assert (
        f"measured {format_number(real['bench_serving_throughput_rps'])} req/s to "
        f"our {format_number(real['ours_throughput_rps'])}, ratio {real['ratio']:.3f}"
    ) in text
    ttft = [format_number(real[f"{client}_ttft_p50_ms"]) for client in CLIENTS]
    assert f"{ttft[0]} ms against {ttft[1]}" in text
    assert f"about {1 - 1 / real['ratio']:.0%} lower" in text


def test_the_readme_quotes_each_experiments_ratio_and_verdict():
    readme = (ROOT / "README.md").read_text()
    quoted = {}
    for experiment in EXPERIMENTS:
        summary, _ = tables(experiment)
        quoted[experiment] = f"{summary['ratio']:.3f}x", summary["verdict"]
    ratio, verdict = quoted["crosscheck-embedded"]
    assert f"{ratio} its throughput on the embedded engine (**{verdict}**)" in readme
    ratio, verdict = quoted["crosscheck-sglang-cpu"]
    assert f"{ratio} on the real server on CPU (**{verdict}**:" in readme
