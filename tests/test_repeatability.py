"""Each results page's claims across its sessions (analysis/repeatability.py): the
published tables are what the committed sessions give, a session's runs give what
its own aggregate gave, and every page shows the section those tables make."""

import json
import re
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from serving_study.analysis.claims import describe_ratio_bound
from serving_study.analysis.repeatability import (
    FLIPS,
    parse_bound,
    read_session,
    repeatability_tables,
    session_folders,
)
from serving_study.analysis.repeatability_text import section

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGES = sorted(page for page in RESULTS.iterdir() if session_folders(page))
SESSIONS = [folder for page in PAGES for folder in session_folders(page)]
GPU_HOST = RESULTS / "gpu-host"


def flat(text: str) -> str:
    return " ".join(text.split())


def published(page: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    folder = page / "repeatability"
    return pd.read_csv(folder / "claims.csv"), pd.read_csv(folder / "arms.csv")


def label(folder: Path) -> str:
    return str(folder.relative_to(RESULTS))


def test_every_page_with_claims_is_covered():
    assert {page.name for page in PAGES} == {
        "embedded-b1",
        "gpu-host",
        "gpu-host-real",
        "sglang-cpu",
        "sglang-cpu-fixes",
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_the_published_tables_are_what_the_committed_sessions_give(page):
    claims, arms = repeatability_tables(page)
    published_claims, published_arms = published(page)
    pd.testing.assert_frame_equal(published_claims, claims, check_dtype=False)
    pd.testing.assert_frame_equal(published_arms, arms, check_dtype=False)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_each_page_shows_the_section_its_tables_make(page):
    text = flat((page / "README.md").read_text())
    assert flat(section(*published(page))) in text


@pytest.mark.parametrize(
    "folder",
    [folder for folder in SESSIONS if (folder / "runs").is_dir()],
    ids=label,
)
def test_a_session_of_runs_gives_what_its_own_aggregate_gave(folder):
    """Recomputed from the runs' metrics.json: each claim's value, block range and
    verdict as the session's tables/claims.csv and ratios.csv hold them."""
    page = folder if folder.parent.name != "sessions" else folder.parent.parent
    claims, _ = repeatability_tables(page)
    session = read_session(folder, page)
    mine = claims[claims["session"] == session.name].set_index("claim")
    theirs = pd.read_csv(folder / "tables" / "claims.csv").set_index("claim")
    ratios = pd.read_csv(folder / "tables" / "ratios.csv").set_index("claim")
    assert list(mine.index) == list(theirs.index)
    for claim, row in mine.iterrows():
        assert row["value"] == pytest.approx(theirs.loc[claim, "value"], rel=1e-12)
        assert row["verdict"] == theirs.loc[claim, "verdict"]
        if claim in ratios.index:
            assert row["blocks"] == ratios.loc[claim, "paired_blocks"]
            assert row["block_min"] == pytest.approx(
                ratios.loc[claim, "block_ratio_min"]
            )
            assert row["block_max"] == pytest.approx(
                ratios.loc[claim, "block_ratio_max"]
            )


@pytest.mark.parametrize(
    "folder",
    [folder for folder in SESSIONS if folder.parent.name == "sessions"],
    ids=label,
)
def test_a_session_folder_is_named_by_the_day_it_ran(folder):
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}(-[a-z0-9-]+)?", folder.name)
    starts = [
        json.loads(path.read_text())["started_at"]
        for path in folder.glob("runs/*/run*/provenance.json")
    ]
    if starts:
        day = f"{datetime.fromisoformat(min(starts)):%Y-%m-%d}"
    else:
        day = json.loads((folder / "session.json").read_text())["when"][:10]
    assert folder.name[:10] == day


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_no_two_sessions_of_a_page_share_a_name(page):
    """The top level is named by the day its runs began, which a folder under
    sessions/ must not also be named."""
    names = [read_session(folder, page).name for folder in session_folders(page)]
    assert len(names) == len(set(names))


def test_a_bound_reads_back_as_every_shipped_config_states_it():
    for path in sorted((ROOT / "config").rglob("*.yaml")):
        if path.parent.name == "schema":
            continue
        for claim in yaml.safe_load(path.read_text()).get("claims") or []:
            if claim.get("kind") == "within":
                text = f"spread at most {claim['tolerance']:.0%}"
                assert parse_bound(text) == {"tolerance": claim["tolerance"]}
            else:
                bound = {
                    key: claim[key] for key in ("at_least", "at_most") if key in claim
                }
                assert parse_bound(describe_ratio_bound(claim)) == bound, path.name


def test_the_gpu_host_sessions_show_the_cuda_ipc_verdict_flip():
    """E/A held in the first two sessions and not in the 2x2's second session; every
    session's value is the one its own claims table gives."""
    claims, _ = published(GPU_HOST)
    e_over_a = claims[claims["claim"] == "cuda-ipc-avoids-the-copy"]
    assert list(e_over_a["session"]) == ["2026-11-30", "2026-12-01", "2026-12-03-2x2"]
    assert list(e_over_a["verdict"]) == ["holds", "holds", "does not hold"]
    assert set(e_over_a["between_sessions"]) == {FLIPS}
    for row in e_over_a.itertuples():
        folder = (
            GPU_HOST
            if row.session == "2026-12-01"
            else GPU_HOST / "sessions" / row.session
        )
        own = pd.read_csv(folder / "tables" / "claims.csv").set_index("claim")
        assert row.value == pytest.approx(own.loc["cuda-ipc-avoids-the-copy", "value"])
    assert set(
        claims.loc[claims["claim"] != "cuda-ipc-avoids-the-copy", "between_sessions"]
    ) <= {
        "same",
        "one session",
    }
    text = flat((GPU_HOST / "README.md").read_text())
    assert "| cuda-ipc-avoids-the-copy (E/A) | at least 2x |" in text
    assert "does not hold | flips |" in text


def test_the_gpu_host_pages_say_how_the_second_session_ran():
    session = GPU_HOST / "sessions" / "2026-12-03-2x2"
    provenances = [
        json.loads(path.read_text())
        for path in session.glob("runs/*/run*/provenance.json")
    ]
    runs = pd.read_csv(session / "tables" / "runs.csv")
    text = flat((GPU_HOST / "README.md").read_text())
    valid = int(runs["valid"].sum())
    assert f"{valid} of {len(runs)} runs valid" in text and valid == len(runs) == 25
    assert sorted(set(runs["arm"])) == ["A", "B", "C", "D", "E"]
    assert (runs.groupby("arm").size() == 5).all()
    assert {run["project"]["commit"][:7] for run in provenances} == {"c358dd2"}
    assert "names c358dd2 with a dirty tree" in text
    config = yaml.safe_load((ROOT / "config" / "gpu-host-2x2.yaml").read_text())
    assert {arm["name"] for arm in config["arms"]} == {"A", "B", "C", "D", "E"}
    earlier = GPU_HOST / "sessions" / "2026-11-30" / "tables" / "ratios.csv"
    assert set(pd.read_csv(earlier)["paired_blocks"]) == {3}
    assert "(3 runs per arm;" in text


def test_the_readme_quotes_the_second_gpu_session():
    claims, arms = published(GPU_HOST)
    second = "2026-12-03-2x2"
    a = arms[(arms["arm"] == "A") & (arms["session"] == second)].iloc[0]
    e_over_a = claims[claims["claim"] == "cuda-ipc-avoids-the-copy"].set_index(
        "session"
    )
    text = flat((ROOT / "README.md").read_text())
    assert (
        f"gave A {a['median']:.1f} req/s, and E/A "
        f'{e_over_a.loc[second, "value"]:.3f} against "at least 2x", which held '
        f"with {e_over_a.loc['2026-12-01', 'value']:.3f} in the first" in text
    )
    assert e_over_a.loc["2026-12-01", "verdict"] == "holds"


def test_a_claim_of_other_arms_is_not_compared_across_sessions():
    """gpu-host-real's pilot judged fixes-agree on B and C, its main session on B, C
    and D: two claims of one name, each of one session, neither flipping."""
    claims, _ = repeatability_tables(RESULTS / "gpu-host-real")
    agree = claims[claims["claim"] == "fixes-agree"]
    assert sorted(agree["ratio"]) == ["B, C within", "B, C, D within"]
    assert set(agree["between_sessions"]) == {"one session"}
