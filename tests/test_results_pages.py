"""The results pages say what their committed runs show about how they were made:
the order the runs ran in, when they ran, the files beside them, and the figures
they borrow from another page."""

import json
import re
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PAGES_WITH_RUNS = sorted(
    page.parent
    for page in RESULTS.glob("*/README.md")
    if (page.parent / "runs").is_dir()
)


def provenances(results: Path) -> list[dict]:
    """Every committed run's provenance, in the order the runs started."""
    found = [
        json.loads(path.read_text())
        for path in results.glob("runs/*/run*/provenance.json")
    ]
    return sorted(found, key=lambda provenance: provenance["started_at"])


def variant_of(provenance: dict) -> str:
    variant = provenance["variant"]
    return variant["name"] if isinstance(variant, dict) else variant


def one_variant_after_the_other(results: Path) -> bool:
    """Whether every run of one variant started before any run of another."""
    order = [variant_of(provenance) for provenance in provenances(results)]
    changes = sum(1 for before, after in pairwise(order) if before != after)
    return len(set(order)) > 1 and changes == len(set(order)) - 1


def runs_by_block(results: Path) -> dict[int, set[str]]:
    """The arms each block measured: block k holds every arm's run k."""
    blocks: dict[int, set[str]] = {}
    for path in results.glob("runs/*/run*/provenance.json"):
        blocks.setdefault(int(path.parent.name[3:]), set()).add(path.parent.parent.name)
    return blocks


# Sessions measured before the arms ran in blocks (their pages say so).
NOT_INTERLEAVED = {"embedded-b1/sessions/2026-12-01", "sglang-cpu/sessions/2026-12-01"}
SESSIONS_WITH_RUNS = sorted(
    folder.parent.relative_to(RESULTS).as_posix()
    for folder in RESULTS.glob("*/sessions/*/runs")
)


@pytest.mark.parametrize(
    "session",
    [page.name for page in PAGES_WITH_RUNS]
    + [s for s in SESSIONS_WITH_RUNS if s not in NOT_INTERLEAVED],
)
def test_every_published_study_ran_in_interleaved_blocks(session):
    """Every block holds every arm that has that many runs, block k ran whole
    before block k + 1, and no variant's runs all came before another's."""
    results = RESULTS / session
    blocks = runs_by_block(results)
    for block, arms in blocks.items():
        expected = {arm for arm, runs in arm_runs(results).items() if runs >= block}
        assert arms == expected, (results.name, block)
    order = [provenance["run"] for provenance in provenances(results)]
    assert order == sorted(order), results.name
    assert not one_variant_after_the_other(results), results.name


def arm_runs(results: Path) -> dict[str, int]:
    return {
        arm.name: len(list(arm.glob("run*/provenance.json")))
        for arm in (results / "runs").iterdir()
    }


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("results", PAGES_WITH_RUNS, ids=lambda path: path.name)
def test_a_page_says_interleaved_only_when_its_runs_were(results):
    text = flat((results / "README.md").read_text())
    claims_interleaving = re.search(r"(?<!not )interleaved", text, re.I) is not None
    if one_variant_after_the_other(results):
        assert not claims_interleaving, results.name
        assert "not interleaved" in text.lower(), results.name


@pytest.mark.parametrize("session", sorted(NOT_INTERLEAVED))
def test_the_sessions_measured_before_blocks_are_shown_as_such(session):
    """Both earlier 2-core sessions ran one variant after the other, and their
    pages say so."""
    assert one_variant_after_the_other(RESULTS / session)
    page = flat((RESULTS / session.split("/")[0] / "README.md").read_text())
    assert re.search(rf"{session.split('/')[-1]}[^.]*not interleaved", page), session


@pytest.mark.parametrize("results", PAGES_WITH_RUNS, ids=lambda path: path.name)
def test_every_file_a_page_lists_is_committed_beside_it(results):
    """The files a page's opening lists (before its first section)."""
    text = (results / "README.md").read_text().split("\n## ")[0]
    named = set(re.findall(r"`([\w.-]+/|[\w.-]+\.(?:json|csv|html))`", text))
    missing = [
        name
        for name in sorted(named)
        if not (results / name).exists() and not list(results.rglob(name.rstrip("/")))
    ]
    assert missing == [], results.name


def test_the_gpu_host_page_gives_the_minutes_its_runs_took():
    runs = provenances(RESULTS / "gpu-host")
    start = datetime.fromisoformat(runs[0]["started_at"])
    end = datetime.fromisoformat(max(run["finished_at"] for run in runs))
    text = flat((RESULTS / "gpu-host" / "README.md").read_text())
    window = f"{start:%Y-%m-%d}, {start:%H:%M}-{end:%H:%M} UTC"
    assert f"Measured on {window}" in text


def test_the_default_page_quotes_the_gpu_hosts_cpu_cost_as_published():
    claims = pd.read_csv(RESULTS / "gpu-host" / "tables" / "claims.csv")
    cost = claims.set_index("claim").loc["original-costs-cpu-without-quota", "value"]
    text = flat((RESULTS / "embedded-b1" / "README.md").read_text())
    assert f"the H200's {cost:.1f}x" in text


@pytest.mark.parametrize("page", ["README.md", "docs/README.md"])
def test_the_status_names_the_studys_geometry_as_not_run(page):
    text = flat((ROOT / page).read_text())
    assert re.search(r"Not run:.{0,200}128-CPU", text) or re.search(
        r"128-CPU geometry.{0,40}have not run", text
    ), page


@pytest.mark.parametrize("results", PAGES_WITH_RUNS, ids=lambda path: path.name)
def test_every_results_page_names_its_stand_in_model(results):
    text = flat((results / "README.md").read_text())
    named = r"stand-in (model|for the model)|model is a stand-in|by a timed stand-in"
    assert re.search(named, text), results.name


PAGES_WITH_CLAIMS = sorted(
    path.parent.parent for path in RESULTS.glob("*/tables/claims.csv")
)


def experiment_of(results: Path) -> str:
    """The experiment a page's runs name (a page may publish another config's,
    as gpu-host-real once published its pilot), or, for a page without runs, the
    page's name."""
    (experiment,) = {
        provenance["experiment"] for provenance in provenances(results)
    } or {results.name}
    return experiment


def experiment_config(results: Path) -> tuple[Path, dict]:
    """The shipped config whose experiment a results page published, checked."""
    from serving_study.config.validation import check_config

    (path,) = [
        path
        for path in (ROOT / "config").glob("*.yaml")
        if yaml.safe_load(path.read_text())["experiment"] == experiment_of(results)
    ]
    config = yaml.safe_load(path.read_text())
    schema = ROOT / "config" / "schema" / "config.schema.yaml"
    return path, check_config(config, schema, [str(path)], ROOT)


@pytest.mark.parametrize("results", PAGES_WITH_CLAIMS, ids=lambda path: path.name)
def test_a_published_claims_table_is_what_its_runs_and_config_give(results):
    """The workflow's own aggregation of the committed runs, with the claims (and
    where each bound came from) of the config as it stands."""
    from serving_study.analysis.aggregate import aggregate

    _, config = experiment_config(results)
    metrics = sorted(results.glob("runs/*/run*/metrics.json"))
    provenance = [path.with_name("provenance.json") for path in metrics]
    tables = aggregate(metrics, config, provenance_paths=provenance)
    published = pd.read_csv(results / "tables" / "claims.csv")
    pd.testing.assert_frame_equal(tables["claims"], published, check_dtype=False)


VERDICTS = "\n## Verdicts, and where each bound came from\n"


def verdicts_section(results: Path) -> str:
    """The page's verdicts section, up to its next section of the same level."""
    text = (results / "README.md").read_text()
    assert VERDICTS in text, results.name
    return text.split(VERDICTS, 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("results", PAGES_WITH_CLAIMS, ids=lambda path: path.name)
def test_a_page_shows_each_verdict_with_what_it_is_and_where_its_bound_came_from(
    results,
):
    """One row per claim with its verdict, test or confirmation, and the words that
    open its bound_from; then each claim's bound_from, whole, in a line naming it."""
    claims = pd.read_csv(results / "tables" / "claims.csv")
    section = verdicts_section(results)
    header, *rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("|---")
    ]
    assert header[-3:] == ["verdict", "test or confirmation", "bound from"]
    assert len(rows) == len(claims), results.name
    bullets = [flat(item) for item in section.split("\n- ")[1:]]
    for claim, row in zip(claims.itertuples(), rows, strict=True):
        assert row[0].split(" (")[0] == claim.claim, results.name
        origin = claim.bound_from.split(": ")[0]
        assert row[-3:] == [claim.verdict, claim.judged_as, origin], claim.claim
        (bullet,) = [
            item for item in bullets if re.match(rf"[\w, -]*\b{claim.claim}\b", item)
        ]
        assert f": {claim.bound_from}." in bullet, claim.claim


ORDINALS = {1: "first", 2: "second", 3: "third", 4: "fourth", 5: "fifth"}


@pytest.mark.parametrize("results", PAGES_WITH_RUNS, ids=lambda path: path.name)
def test_a_page_names_each_run_that_took_more_than_one_attempt(results):
    """As tables/runs.csv counts them (pages measured before runs counted their
    attempts have no such column)."""
    runs = pd.read_csv(results / "tables" / "runs.csv")
    if "attempts" not in runs:
        pytest.skip("measured before runs counted their attempts")
    text = flat((results / "README.md").read_text())
    retried = runs[runs["attempts"] > 1]
    if retried.empty:
        assert "each at its first attempt" in text
    for run in retried.itertuples():
        said = f"{run.arm}'s {ORDINALS[run.run]} run at its {ORDINALS[run.attempts]}"
        assert f"{said} attempt" in text, results.name
