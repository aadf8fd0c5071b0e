"""How a results page's claims repeat across the sessions that measured them.

A page (docs/results/<page>/) keeps its main session at its top level and every
other one in sessions/<date>[-<label>]/. A session holds tables/claims.csv (the
claims of the config it ran, as its aggregate judged them), host.json and its runs
(runs/<arm>/run<k>/), or, for a session that kept only its tables, session.json
(when it ran, and its commit) beside tables/ratios.csv and tables/arms.csv.

From a session's runs each claim is computed again as the aggregate computes it
(claims.py): the ratio of the two arms' medians over valid runs, or the spread of
several arms' medians, with the same figure within each run block and the verdict
against the bound in claims.csv (a claim its aggregate could not tell stays so). A
session of tables alone gives its tables' figures.

A figure varies between sessions more than within one when its sessions' values lie
further apart than its values within any one session: a claim's block ratios, an
arm's runs.
"""

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pandas as pd

from serving_study.analysis.claims import (
    CANNOT_TELL,
    DOES_NOT_HOLD,
    HOLDS,
    block_ratios,
    ratio_within_bounds,
    spread,
)
from serving_study.analysis.numbers import is_number
from serving_study.analysis.summaries import runs_table

FLIPS = "flips"
# A claim is the same across sessions only where its name, its arms and its bound
# are: a config may add an arm to a claim of the same name.
SAME_CLAIM = ["claim", "ratio", "bound"]


@dataclass(frozen=True)
class Session:
    name: str
    when: str
    host: str
    commit: str
    config: str
    folder: Path
    claims: pd.DataFrame
    # One row per run (summaries.runs_table); None for a session of tables alone.
    runs: pd.DataFrame | None


def session_folders(page: Path) -> list[Path]:
    """The page's top level and each folder under its sessions/ that has claims."""
    folders = [page, *sorted(path for path in page.glob("sessions/*") if path.is_dir())]
    return [folder for folder in folders if (folder / "tables/claims.csv").is_file()]


def session_files(page: Path) -> list[Path]:
    """Every file the page's repeatability is read from."""
    files = []
    for folder in session_folders(page):
        files += [folder / "tables/claims.csv", folder / "host.json"]
        metrics = sorted(folder.glob("runs/*/run*/metrics.json"))
        files += [path.with_name(name) for path in metrics for name in RUN_FILES]
        if not metrics:
            files += [folder / name for name in TABLES_ONLY_FILES]
    return files


RUN_FILES = ("metrics.json", "provenance.json")
TABLES_ONLY_FILES = ("session.json", "tables/ratios.csv", "tables/arms.csv")


def read_session(folder: Path, page: Path) -> Session:
    claims = pd.read_csv(folder / "tables/claims.csv")
    host = describe_host(json.loads((folder / "host.json").read_text()))
    metrics = sorted(folder.glob("runs/*/run*/metrics.json"))
    if not metrics:
        record = json.loads((folder / "session.json").read_text())
        return Session(
            folder.name,
            record["when"],
            host,
            record["commit"],
            "–",
            folder,
            claims,
            None,
        )
    provenances = [
        json.loads(path.with_name("provenance.json").read_text()) for path in metrics
    ]
    start = min(datetime.fromisoformat(run["started_at"]) for run in provenances)
    end = max(datetime.fromisoformat(run["finished_at"]) for run in provenances)
    commits = sorted(
        {
            f"{project['commit'][:7]}{', dirty tree' if project['dirty'] else ''}"
            if project.get("commit")
            else "not recorded"
            for project in (run.get("project") or {} for run in provenances)
        }
    )
    configs = sorted({run.get("config_sha256", "")[:8] or "–" for run in provenances})
    return Session(
        name=folder.name if folder != page else f"{start:%Y-%m-%d}",
        when=f"{start:%Y-%m-%d %H:%M}-{end:%H:%M}",
        host=host,
        commit="; ".join(commits),
        config=", ".join(configs),
        folder=folder,
        claims=claims,
        runs=runs_table(
            [json.loads(path.read_text()) for path in metrics], {"arms": []}
        ),
    )


def describe_host(host: dict) -> str:
    """ "16 CPUs (Intel(R) Xeon(R) Processor), NVIDIA H200, Linux 6.18.44-..."."""
    gpus = [gpu["name"] for gpu in (host.get("gpu") or {}).get("gpus") or []]
    parts = [f"{host['cpu_count']} CPUs ({host['cpu_model']})", *gpus]
    return ", ".join([*parts, f"Linux {host['kernel']}"])


def parse_bound(text: str) -> dict:
    """A bound as claims.py writes it in claims.csv: "at least 2x", "at most 0.5x"
    (or both, joined by "and"), or "spread at most 10%"."""
    if within := re.fullmatch(r"spread at most ([\d.]+)%", text):
        return {"tolerance": float(within[1]) / 100}
    words = {"at least": "at_least", "at most": "at_most"}
    found = re.findall(r"(at least|at most) ([\d.e+-]+)x", text)
    return {words[word]: float(number) for word, number in found}


def claim_figures(session: Session) -> list[dict]:
    """Each of the session's claims: its value, block figures and verdict."""
    ratios = None
    if session.runs is None:
        ratios = pd.read_csv(session.folder / "tables/ratios.csv").set_index("claim")
    rows = []
    for claim in session.claims.to_dict("records"):
        arms = [arm.strip() for arm in claim["arms"].split(",")]
        within = claim["kind"] == "within"
        if session.runs is None:
            known = ratios.loc[claim["claim"]] if claim["claim"] in ratios.index else {}
            figures = {
                "value": claim["value"],
                "blocks": known.get("paired_blocks", 0),
                "block_min": known.get("block_ratio_min"),
                "block_max": known.get("block_ratio_max"),
                "verdict": claim["verdict"],
            }
        else:
            figures = judged(claim, arms, parse_bound(claim["bound"]), session.runs)
        rows.append(
            {
                "claim": claim["claim"],
                "ratio": f"{', '.join(arms)} within" if within else "/".join(arms),
                "bound": claim["bound"],
                "session": session.name,
                "when": session.when,
                "host": session.host,
                "commit": session.commit,
                "config": session.config,
                **figures,
            }
        )
    return rows


def judged(claim: dict, arms: list[str], bound: dict, runs: pd.DataFrame) -> dict:
    metric = claim["metric"]
    valid = runs[runs["valid"]]
    medians = [float(valid.loc[valid["arm"] == arm, metric].median()) for arm in arms]
    if claim["kind"] == "within":
        value = spread(medians)
        per_run = valid.pivot_table(index="run", columns="arm", values=metric)
        complete = per_run.reindex(columns=arms).dropna()
        blocks = [spread(list(values)) for values in complete.to_numpy()]
        holds = value <= bound["tolerance"]
    else:
        value = medians[0] / medians[1] if medians[1] else float("nan")
        blocks = list(block_ratios(runs, *arms, metric).values())
        holds = ratio_within_bounds(value, bound)
    # How many valid runs a claim needs is the config's, which the tables do not
    # keep: a claim the session's aggregate could not tell stays so.
    told = claim["verdict"] != CANNOT_TELL and is_number(value)
    verdict = HOLDS if holds else DOES_NOT_HOLD
    return {
        "value": value,
        "blocks": len(blocks),
        "block_min": min(blocks, default=None),
        "block_max": max(blocks, default=None),
        "verdict": verdict if told else CANNOT_TELL,
    }


def arm_figures(session: Session) -> list[dict]:
    """The median, min and max over valid runs of each figure a claim reads."""
    wanted = {
        (arm.strip(), claim["metric"])
        for claim in session.claims.to_dict("records")
        for arm in claim["arms"].split(",")
    }
    if session.runs is None:
        table = pd.read_csv(session.folder / "tables/arms.csv")
        pairs = zip(table["arm"], table["metric"], strict=True)
        table = table[[pair in wanted for pair in pairs]].rename(
            columns={"n_valid": "runs"}
        )
    else:
        valid = session.runs[session.runs["valid"]]
        table = pd.DataFrame(
            {
                "arm": arm,
                "metric": metric,
                "runs": len(values),
                "median": values.median(),
            }
            | {"min": values.min(), "max": values.max()}
            for arm, metric in wanted
            for values in [valid.loc[valid["arm"] == arm, metric].dropna()]
        )
    table = table.assign(session=session.name)
    return table[["arm", "metric", "session", "runs", "median", "min", "max"]].to_dict(
        "records"
    )


def repeatability_tables(page: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every claim and every arm's figure of the page, one row per session, the
    sessions in the order they ran."""
    sessions = sorted(
        (read_session(folder, page) for folder in session_folders(page)),
        key=lambda session: session.when,
    )
    claims = pd.DataFrame(
        [row for session in sessions for row in claim_figures(session)]
    )
    claims["between_sessions"] = claims.groupby(SAME_CLAIM)["verdict"].transform(across)
    arms = pd.DataFrame([row for session in sessions for row in arm_figures(session)])
    arms = arms.sort_values(["arm", "metric"], kind="stable")
    return claims, arms.reset_index(drop=True)


def across(verdicts: pd.Series) -> str:
    """ "flips" where one session's verdict holds and another's does not."""
    if {HOLDS, DOES_NOT_HOLD} <= set(verdicts):
        return FLIPS
    return "one session" if len(verdicts) == 1 else "same"
