"""Two results folders side by side: two hosts, or two sessions of one config.

A results folder is what the aggregate writes (``results/<experiment>/``) or a
published page or session (``docs/results/<page>/``, its ``sessions/<name>/``):
``host.json`` beside ``tables/arms.csv``, ``ratios.csv`` and ``claims.csv``. Only
those are read, so a session that kept only its tables compares as well as one
with its runs.

Three tables come out:

- ``arms``: each arm's figures (COMPARED_METRICS) in both folders, median with
  [min, max] over valid runs and the bootstrap interval where the folder had the
  runs for one (summaries.py), the second's median over the first's, and whether
  the two differ beyond the run-to-run spread by the release series' criterion
  (release_change.py: ranges apart and medians at least ``min_change`` apart), with
  how often ranges of that many runs fall apart by chance alone; and where an arm's
  settings (variant, quota, environment...) differ between the folders;
- ``claims``: each claim's value in both, with its range over run blocks and its
  verdict, as repeatability.py reads a session of tables, and whether the verdict
  flips (not where the two configs judge it against different bounds);
- ``hosts``: each host.json key whose value differs (nested keys dotted), leaving
  out what the preflight adds about the run rather than the host (HOST_EXTRAS).
"""

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import pandas as pd

from serving_study.analysis.release_change import (
    ChangeCriterion,
    Spread,
    compare,
    false_alarm_chance,
)
from serving_study.analysis.repeatability import (
    Session,
    across,
    claim_figures,
    describe_host,
)
from serving_study.metric_catalogue import METRICS

COMPARED_METRICS = (
    "throughput_rps",
    "ttft_p50_ms",
    "tpot_p50_ms",
    "main_cpu_ms_per_request",
    "throttled_share",
)
FOLDER_FILES = (
    "host.json",
    "tables/arms.csv",
    "tables/ratios.csv",
    "tables/claims.csv",
)
# What the arm's settings are, as arms.csv keeps them.
ARM_SETTINGS = ("variant", "transport", "concurrency", "cpu_quota", "environment")
# What host.json holds about the run rather than the host: each arm's thread plan
# and what the preflight cleaned up.
HOST_EXTRAS = ("arms", "leftovers_reaped")
SIDES = ("first", "second")
# Each side's columns in the arms table, from arms.csv.
FIGURES = ("runs", "median", "min", "max", "ci_low", "ci_high")


@dataclass(frozen=True)
class ComparedFolders:
    """The two results folders of config key ``compare``, in its order."""

    first: Path
    second: Path

    @classmethod
    def from_config(cls, folders: list[str] | None) -> Self | None:
        if not folders:
            return None
        first, second = folders
        return cls(Path(first), Path(second))

    def as_config(self) -> list[str]:
        return [str(self.first), str(self.second)]

    def files(self, side: str) -> list[str]:
        """Every file the comparison reads of one folder (FOLDER_FILES)."""
        folder = getattr(self, side)
        return [str(folder / name) for name in FOLDER_FILES]

    def labels(self) -> tuple[str, str]:
        """Each folder's shortest ending of its path that tells the two apart:
        "embedded-b1" and "2026-12-01", "results/embedded-b1" and
        "docs/results/embedded-b1"."""
        first, second = (
            Path(os.path.normpath(path)).parts for path in self.as_config()
        )
        for length in range(1, max(len(first), len(second)) + 1):
            labels = "/".join(first[-length:]), "/".join(second[-length:])
            if labels[0] != labels[1]:
                return labels
        return str(self.first), str(self.second)


def compared_files(folders: ComparedFolders | None, side: str) -> list[str]:
    """What rule compare reads of one folder ("first" or "second"); without
    config key ``compare``, how to give it."""
    if folders is None:
        raise ValueError(
            "rule compare needs two results folders: snakemake --cores 1 compare "
            "--config 'compare=[<first folder>, <second folder>]'"
        )
    return folders.files(side)


@dataclass(frozen=True)
class ResultsFolder:
    label: str
    path: Path
    host: dict
    arms: pd.DataFrame
    claims: pd.DataFrame


def read_folder(path: Path, label: str) -> ResultsFolder:
    tables = Path(path) / "tables"
    return ResultsFolder(
        label=label,
        path=Path(path),
        host=json.loads((Path(path) / "host.json").read_text(encoding="utf-8")),
        arms=pd.read_csv(tables / "arms.csv"),
        claims=pd.read_csv(tables / "claims.csv"),
    )


def comparison_tables(
    folders: ComparedFolders, criterion: ChangeCriterion
) -> dict[str, pd.DataFrame]:
    """The ``arms``, ``claims`` and ``hosts`` tables (module docstring)."""
    first, second = (
        read_folder(getattr(folders, side), label)
        for side, label in zip(SIDES, folders.labels(), strict=True)
    )
    return {
        "folders": folders_table(first, second),
        "arms": arms_compared(first, second, criterion),
        "claims": claims_compared(first, second),
        "hosts": hosts_compared(first.host, second.host),
    }


def folders_table(first: ResultsFolder, second: ResultsFolder) -> pd.DataFrame:
    """Each folder: its label, path and host in a line, and its count of runs."""
    rows = []
    for side, folder in zip(SIDES, (first, second), strict=True):
        per_arm = folder.arms.drop_duplicates("arm")
        rows.append(
            {
                "side": side,
                "label": folder.label,
                "path": str(folder.path),
                "host": describe_host(folder.host),
                "arms": len(per_arm),
                "valid_runs": int(per_arm["n_valid"].sum()),
                "runs": int(per_arm["n_total"].sum()),
            }
        )
    return pd.DataFrame(rows)


def arms_compared(
    first: ResultsFolder, second: ResultsFolder, criterion: ChangeCriterion
) -> pd.DataFrame:
    """Each arm of either folder and each compared figure, first then second."""
    names = list(dict.fromkeys([*first.arms["arm"], *second.arms["arm"]]))
    rows = []
    for arm in names:
        for metric in COMPARED_METRICS:
            sides = [figures_of(folder.arms, arm, metric) for folder in (first, second)]
            if not any(side["runs"] for side in sides):
                continue
            row = {"arm": arm, "metric": metric, "label": METRICS[metric].label}
            row |= {"unit": METRICS[metric].unit}
            for side, figures in zip(SIDES, sides, strict=True):
                row |= {f"{side}_{key}": value for key, value in figures.items()}
            rows.append(row | change(first, second, arm, metric, criterion))
    columns = ["arm", "metric", "label", "unit"]
    columns += [f"{side}_{key}" for side in SIDES for key in FIGURES]
    columns += ["ratio", "verdict", "detail", "settings"]
    table = pd.DataFrame(rows, columns=columns)
    settings = {arm: settings_differ(first.arms, second.arms, arm) for arm in names}
    table["settings"] = table["arm"].map(settings)
    return table


def figures_of(arms: pd.DataFrame, arm: str, metric: str) -> dict:
    """An arm's figure over its valid runs, as arms.csv holds it; no runs where the
    folder lacks the arm or the figure."""
    rows = arms[(arms["arm"] == arm) & (arms["metric"] == metric)]
    if rows.empty or not rows.iloc[0]["n_values"]:
        return dict.fromkeys(FIGURES, math.nan) | {"runs": 0}
    row = rows.iloc[0]
    return {"runs": int(row["n_values"])} | {key: row[key] for key in FIGURES[1:]}


def change(
    first: ResultsFolder,
    second: ResultsFolder,
    arm: str,
    metric: str,
    criterion: ChangeCriterion,
) -> dict:
    """Second over first, and the release series' criterion on the two."""
    earlier = Spread.of_arm(first.arms, arm, metric)
    later = Spread.of_arm(second.arms, arm, metric)
    ratio = later.median / earlier.median if earlier.median else math.nan
    judged = compare(earlier, later, criterion)
    detail = judged.detail
    chance = false_alarm_chance(earlier.runs, later.runs)
    if not math.isnan(chance) and earlier.runs and later.runs:
        detail += (
            f"; ranges of {earlier.runs} and {later.runs} runs fall apart by "
            f"chance alone {chance:.1%} of the time"
        )
    return {"ratio": ratio, "verdict": judged.verdict, "detail": detail}


def settings_differ(first: pd.DataFrame, second: pd.DataFrame, arm: str) -> str:
    """ "same", the settings that differ ("cpu_quota 1.7 / 0.5"), or in which
    folder the arm is missing."""
    rows = [arms[arms["arm"] == arm] for arms in (first, second)]
    for side, row in zip(SIDES, rows, strict=True):
        if row.empty:
            return f"not in the {side} folder"
    one, other = (row.iloc[0] for row in rows)
    differ = [
        f"{key} {text(one[key])} / {text(other[key])}"
        for key in ARM_SETTINGS
        if text(one[key]) != text(other[key])
    ]
    return "; ".join(differ) or "same"


def text(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "none" if pd.isna(value) else str(value)


def claims_compared(first: ResultsFolder, second: ResultsFolder) -> pd.DataFrame:
    """Each claim of either folder, one row per folder that states it, as
    repeatability.py reads a session of tables; ``between`` says whether its
    verdict flips."""
    rows = []
    for folder in (first, second):
        session = Session(
            name=folder.label,
            when="",
            host=describe_host(folder.host),
            commit="",
            config="",
            folder=folder.path,
            claims=folder.claims,
            runs=None,
        )
        rows += claim_figures(session)
    columns = ["claim", "ratio", "bound", "session", "value", "blocks"]
    columns += ["block_min", "block_max", "verdict"]
    claims = pd.DataFrame(rows)[columns].rename(columns={"session": "folder"})
    between = {
        claim: between_folders(group)
        for claim, group in claims.groupby("claim", sort=False)
    }
    return claims.assign(between=claims["claim"].map(between))


def between_folders(rows: pd.DataFrame) -> str:
    """ "flips", "same", "one folder", or "bounds differ" where the two configs
    judge the claim against different bounds (a verdict cannot flip then)."""
    if rows["bound"].nunique() > 1:
        return "bounds differ"
    return across(rows["verdict"]).replace("one session", "one folder")


def hosts_compared(first: dict, second: dict) -> pd.DataFrame:
    """Each host.json key (nested keys dotted) whose values differ."""
    one, other = flattened(first), flattened(second)
    keys = list(dict.fromkeys([*one, *other]))
    rows = [
        {"key": key, "first": one.get(key, "not recorded")}
        | {"second": other.get(key, "not recorded")}
        for key in keys
        if one.get(key) != other.get(key)
    ]
    return pd.DataFrame(rows, columns=["key", "first", "second"])


def flattened(host: dict) -> dict[str, str]:
    """host.json as dotted keys and text values, less HOST_EXTRAS."""
    flat = {}

    def walk(value, key: str) -> None:
        if isinstance(value, dict) and value:
            for name, item in value.items():
                walk(item, f"{key}.{name}" if key else name)
        elif isinstance(value, list) and value:
            for index, item in enumerate(value):
                walk(item, f"{key}.{index}")
        else:
            flat[key] = json.dumps(value) if isinstance(value, dict | list) else value

    walk({k: v for k, v in host.items() if k not in HOST_EXTRAS}, "")
    return {key: "none" if value is None else str(value) for key, value in flat.items()}
