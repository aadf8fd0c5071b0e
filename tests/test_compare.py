"""Rule compare on the published results folders: two sessions of the default
study on two hosts, two sessions of the GPU host (with bootstrap intervals), and
two configs on two hosts. Every figure is checked against the folders' own tables
and host.json, and the claims against the page's repeatability tables."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from serving_study.analysis.comparison import (
    ComparedFolders,
    compared_files,
    comparison_tables,
)
from serving_study.analysis.release_change import ChangeCriterion
from serving_study.report.comparison_page import comparison_page

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
EMBEDDED = RESULTS / "embedded-b1"
EMBEDDED_SESSION = EMBEDDED / "sessions" / "2026-12-01"
GPU_HOST = RESULTS / "gpu-host"
GPU_2X2 = GPU_HOST / "sessions" / "2026-12-03-2x2"


def compared(first: Path, second: Path) -> dict[str, pd.DataFrame]:
    folders = ComparedFolders.from_config([str(first), str(second)])
    return comparison_tables(folders, ChangeCriterion())


@pytest.fixture(scope="module")
def embedded():
    return compared(EMBEDDED, EMBEDDED_SESSION)


def test_each_folder_is_named_by_the_end_of_its_path_that_tells_them_apart():
    def labels(first, second):
        return ComparedFolders.from_config([first, second]).labels()

    assert labels(str(EMBEDDED), str(EMBEDDED_SESSION)) == ("embedded-b1", "2026-12-01")
    assert labels("results/embedded-b1", "docs/results/embedded-b1/") == (
        "results/embedded-b1",
        "docs/results/embedded-b1",
    )


def flat(host: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in host.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= flat(value, f"{name}.")
        elif isinstance(value, list) and value:
            out |= flat(dict(enumerate(value)), f"{name}.")
        else:
            out[name] = "none" if value is None else str(value)
    return out


@pytest.mark.parametrize(
    ("first", "second"), [(EMBEDDED, EMBEDDED_SESSION), (GPU_HOST, GPU_2X2)]
)
def test_the_hosts_keys_that_differ_and_only_those_are_listed(first, second):
    hosts = compared(first, second)["hosts"]
    one, other = (json.loads((f / "host.json").read_text()) for f in (first, second))
    # What the preflight adds about the runs is not the host's.
    for host in (one, other):
        host.pop("arms", None)
        host.pop("leftovers_reaped", None)
    one, other = flat(one), flat(other)
    differ = [key for key in one | other if one.get(key) != other.get(key)]
    assert sorted(hosts["key"]) == sorted(differ)
    for row in hosts.to_dict("records"):
        assert row["first"] == one.get(row["key"], "not recorded")
        assert row["second"] == other.get(row["key"], "not recorded")
    if first == EMBEDDED:
        assert {"kernel", "cpu_model"} <= set(hosts["key"])
        assert "cpu_count" not in set(hosts["key"])  # 2 CPUs on both


def valid_runs(folder: Path, arm: str, metric: str) -> pd.Series:
    runs = pd.read_csv(folder / "tables" / "runs.csv")
    return runs.loc[(runs["arm"] == arm) & runs["valid"], metric]


def test_each_arm_is_its_folders_medians_and_ranges_and_judged_by_the_runs(embedded):
    arms = embedded["arms"]
    assert set(arms["arm"]) == {"A", "B", "C", "D", "A-passive", "A-spin0"} | {
        "A-free",
        "C-free",
    }
    assert (arms["settings"] == "same").all()
    for row in arms.to_dict("records"):
        first = valid_runs(EMBEDDED, row["arm"], row["metric"])
        second = valid_runs(EMBEDDED_SESSION, row["arm"], row["metric"])
        assert row["first_median"] == pytest.approx(first.median())
        assert (row["second_min"], row["second_max"]) == pytest.approx(
            (second.min(), second.max())
        )
        assert row["first_runs"] == row["second_runs"] == 3
        if row["verdict"] == "cannot tell":  # a median of zero: nothing throttled
            assert row["metric"] == "throttled_share" and first.median() == 0
            continue
        ratio = second.median() / first.median()
        assert row["ratio"] == pytest.approx(ratio)
        apart = second.min() > first.max() or second.max() < first.min()
        changed = apart and max(ratio, 1 / ratio) >= 1.05
        assert row["verdict"] == ("changed" if changed else "no change")
        assert "fall apart by chance alone 10.0% of the time" in row["detail"]
    throughput = arms.set_index(["arm", "metric"]).loc[("A", "throughput_rps")]
    assert throughput["verdict"] == "changed"


def test_each_claim_is_as_the_pages_repeatability_has_it(embedded):
    """Two sessions of one page: the same values, verdicts and flips as the
    page's repeatability table, which computes them again from the runs."""
    claims = embedded["claims"]
    published = pd.read_csv(EMBEDDED / "repeatability" / "claims.csv")
    published = published.replace({"session": {"2026-12-03": "embedded-b1"}})
    mine = claims.set_index(["claim", "folder"])
    for row in published.to_dict("records"):
        found = mine.loc[(row["claim"], row["session"])]
        assert found["value"] == pytest.approx(row["value"])
        assert found["verdict"] == row["verdict"]
        assert found["between"] == row["between_sessions"]
    flips = set(claims.loc[claims["between"] == "flips", "claim"])
    assert flips == {"original-costs-cpu-without-quota"}


def test_five_runs_give_the_bootstrap_interval_and_a_lone_claim_says_so():
    tables = compared(GPU_HOST, GPU_2X2)
    arms = tables["arms"].set_index(["arm", "metric"])
    published = pd.read_csv(GPU_HOST / "tables" / "arms.csv")
    published = published.set_index(["arm", "metric"])
    row = arms.loc[("A", "throughput_rps")]
    assert (row["first_ci_low"], row["first_ci_high"]) == pytest.approx(
        tuple(published.loc[("A", "throughput_rps"), ["ci_low", "ci_high"]])
    )
    assert "0.8% of the time" in row["detail"]  # ranges of 5 and 5 runs
    # Arms of the first folder alone: in the table, said missing from the second.
    assert arms.loc[("A-free", "throughput_rps"), "settings"] == (
        "not in the second folder"
    )
    claims = tables["claims"].drop_duplicates("claim").set_index("claim")["between"]
    assert claims["cuda-ipc-avoids-the-copy"] == "flips"
    assert claims["original-costs-cpu-without-quota"] == "one folder"


def test_two_configs_on_two_hosts_say_where_arms_and_bounds_differ():
    tables = compared(GPU_HOST / "sessions" / "2026-11-30", EMBEDDED)
    arms = tables["arms"].drop_duplicates("arm").set_index("arm")["settings"]
    assert arms["A"] == "cpu_quota 1.7 / 0.5"
    claims = tables["claims"].drop_duplicates("claim").set_index("claim")["between"]
    # The GPU host's C/A bound is 2x, the 2-core host's 1.2x.
    assert claims["patch-recovers-throughput"] == "bounds differ"
    assert {"cpu_count", "cgroup_version", "gpu.gpus.0.name"} <= set(
        tables["hosts"]["key"]
    )


def test_the_page_shows_both_folders_side_by_side(embedded):
    page = comparison_page(embedded, ChangeCriterion())
    assert "embedded-b1 and 2026-12-01, side by side" in page
    assert "AMD EPYC" in page and "Intel(R) Xeon(R) Processor" in page
    for name in ("compare_arms", "compare_claims"):
        assert f'data-chart="chart-{name}"' in page
    # A's throughput: median [min–max] (runs) in each folder, and their ratio.
    a = embedded["arms"].set_index(["arm", "metric"]).loc[("A", "throughput_rps")]
    assert (
        f"{a['first_median']:.3g} [{a['first_min']:.3g}–{a['first_max']:.3g}]" in page
    )
    assert f"{a['ratio']:.3g}x" in page
    assert "original-costs-cpu-without-quota (A-free/C-free)" in page


def test_without_the_folders_the_rule_says_how_to_give_them():
    with pytest.raises(ValueError, match=r"--config 'compare=\[<first folder>"):
        compared_files(None, "first")


@pytest.mark.slow
def test_snakemake_compare_writes_the_tables_and_the_page(tmp_path, embedded):
    """The rule end to end, on the two sessions of the default study."""
    folders = f"compare=[{EMBEDDED}, {EMBEDDED_SESSION}]"
    command = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile")]
    command += ["--directory", str(tmp_path), "--cores", "1", "compare"]
    done = subprocess.run(
        [*command, "--config", folders], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "results" / "compare"
    for name in ("arms", "claims", "hosts"):
        written = pd.read_csv(out / f"{name}.csv")
        pd.testing.assert_frame_equal(
            written, embedded[name].reset_index(drop=True), check_dtype=False
        )
    page = (out / "compare.html").read_text()
    assert "embedded-b1 and 2026-12-01, side by side" in page


def test_the_docs_quote_the_default_studys_two_sessions_as_compared(embedded):
    text = " ".join((ROOT / "docs" / "reading-results.md").read_text().split())
    a = embedded["arms"].set_index(["arm", "metric"]).loc[("A", "throughput_rps")]
    assert (
        f"arm A served {a['first_median']:.1f} req/s against "
        f'{a["second_median"]:.1f}, ranges apart, "{a["verdict"]}"'
    ) in text
    assert "ranges of 3 and 3 runs fall apart by chance alone 10% of the time" in text
    claim = (
        embedded["claims"].set_index("claim").loc["original-costs-cpu-without-quota"]
    )
    first, second = claim.to_dict("records")
    assert (
        f"flips, {first['value']:.3f} ({first['verdict']}) against "
        f"{second['value']:.3f} ({second['verdict']})"
    ) in text
    assert {"cpu_model", "kernel"} <= set(embedded["hosts"]["key"])
