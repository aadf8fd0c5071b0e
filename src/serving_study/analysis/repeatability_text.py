"""A page's repeatability in words: its sessions, each claim's value in each, and
the sentence on what varies between sessions more than within one, all from the two
tables of repeatability.py."""

import math

import pandas as pd

from serving_study.analysis.repeatability import FLIPS, SAME_CLAIM
from serving_study.metric_catalogue import METRICS


def shown(value: float, ratio: str) -> str:
    """A claim's figure: a ratio to 3 decimals, a spread ("B, C within") in percent."""
    if value is None or math.isnan(value):
        return "–"
    return f"{value:.1%}" if is_spread(ratio) else f"{value:.3f}"


def is_spread(ratio: str) -> bool:
    return ratio.endswith(" within")


def named(ratio: str) -> str:
    """ "E/A", or "the spread of B, C, D" for a claim that arms lie within a spread."""
    return (
        f"the spread of {ratio.removesuffix(' within')}" if is_spread(ratio) else ratio
    )


def listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def section(claims: pd.DataFrame, arms: pd.DataFrame) -> str:
    """The Markdown a page's README shows: its sessions, the claims in each, and the
    sentence."""
    sessions = claims.drop_duplicates("session")
    lines = [
        "| session | when (UTC) | host | commit | config |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {row.session} | {row.when} | {row.host} | {row.commit} | {row.config} |"
        for row in sessions.itertuples()
    ]
    names = list(sessions["session"])
    lines += ["", f"| claim | bound | {' | '.join(names)} | between sessions |"]
    lines.append("|---|---|" + "---|" * len(names) + "---|")
    for (claim, _, _), rows in claims.groupby(SAME_CLAIM, sort=False):
        cells = {row.session: cell(row) for row in rows.itertuples()}
        first = rows.iloc[0]
        values = " | ".join(cells.get(name, "–") for name in names)
        lines.append(
            f"| {claim} ({first.ratio}) | {first.bound} | {values} | "
            f"{first.between_sessions} |"
        )
    return "\n".join([*lines, "", what_varies(claims, arms)]) + "\n"


def cell(row) -> str:
    blocks = f" [{shown(row.block_min, row.ratio)}-{shown(row.block_max, row.ratio)}]"
    return f"{shown(row.value, row.ratio)}{blocks if row.blocks else ''}, {row.verdict}"


def what_varies(claims: pd.DataFrame, arms: pd.DataFrame) -> str:
    """Which arms' medians and claims' values lie further apart between sessions than
    within any one (an arm's runs, a claim's block figures), and which verdicts
    flip."""
    names = list(dict.fromkeys(claims["session"]))
    if len(names) == 1:
        return (
            f"One session so far ({names[0]}): what varies between sessions more "
            "than within one is not measured yet."
        )
    more, steady_arms, steady_claims = [], [], []
    for (arm, metric), rows in arms.groupby(["arm", "metric"], sort=False):
        if len(rows) > 1:
            between = rows["median"].max() / rows["median"].min() - 1
            within = (rows["max"] / rows["min"] - 1).max()
            if between <= within:
                steady_arms.append(arm)
                continue
            metric_info = METRICS[metric]
            medians = listed([f"{value:.4g}" for value in rows["median"]])
            more.append(
                f"{arm}'s median {metric_info.label} ({medians} {metric_info.unit}: "
                f"{between:.1%} apart, its runs within one session at most "
                f"{within:.1%})"
            )
    for _, rows in claims.groupby(SAME_CLAIM, sort=False):
        within = (rows["block_max"] - rows["block_min"]).max()
        if len(rows) > 1 and not math.isnan(within):
            ratio = rows["ratio"].iloc[0]
            between = rows["value"].max() - rows["value"].min()
            if between <= within:
                steady_claims.append(named(ratio))
                continue
            values = listed([shown(value, ratio) for value in rows["value"]])
            more.append(
                f"{named(ratio)} ({values}: {shown(between, ratio)} apart, its block "
                f"figures within one session at most {shown(within, ratio)})"
            )
    steady = [f"the medians of {listed(steady_arms)}"] if steady_arms else []
    steady += steady_claims
    sentence = f"Across {len(names)} sessions ({listed(names)}), " + (
        f"{listed(more)} varied more between sessions than within one"
        if more
        else "nothing varied more between sessions than within one"
    )
    sentence += f"; {listed(steady)} varied less." if steady else "."
    for (claim, _, _), rows in claims[claims["between_sessions"] == FLIPS].groupby(
        SAME_CLAIM, sort=False
    ):
        by_verdict = rows.groupby("verdict", sort=False)["session"].agg(list)
        sentence += (
            f" The verdict of {claim} ({rows['ratio'].iloc[0]}) flips: "
            + (
                "; ".join(
                    f"{verdict} in {listed(where)}"
                    for verdict, where in by_verdict.items()
                )
            )
            + "."
        )
    return sentence
