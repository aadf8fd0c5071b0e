"""From every run's metrics to the study's tables, and the tables on disk.

The tables, each written as CSV:

- `runs` and `arms`: every run with every figure, valid or not (flagged where its
  node differs from host.json), and each arm's figures over its valid runs beside
  the study's reference values (summaries.py);
- `ratios` and `claims`: each ratio claim's ratio of medians and within each
  repetition block, and one verdict per claim: holds, does not hold, or cannot
  tell when an arm has too few valid runs (claims.py);
- `invalid_runs`: which runs were left out and why;
- `attempts`: each run's earlier attempts, from its attempts.json (attempts.py);
- `releases` (only when the config sets `release_series`): each release
  against the one before it (release_change.py);
- `fixes` (only when the config sets `fixes`): each fix beside the trap
  (fix_comparison.py).

A run's attempts.json and provenance.json lie beside its metrics.json and come
in the same order.
"""

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from serving_study.analysis.attempts import ATTEMPTS_TABLE, attempts_table, tries
from serving_study.analysis.claims import check_claims, claims_table, ratios_table
from serving_study.analysis.crosscheck_table import RUNS_TABLE as CROSSCHECK_RUNS_TABLE
from serving_study.analysis.crosscheck_table import SUMMARY_TABLE as CROSSCHECK_TABLE
from serving_study.analysis.fix_comparison import FIXES_TABLE, fixes_table
from serving_study.analysis.release_change import (
    ChangeCriterion,
    release_labels,
    releases_table,
)
from serving_study.analysis.summaries import (
    NODE_FLAG,
    arms_table,
    invalid_runs_table,
    runs_table,
)

TABLE_NAMES = ("runs", "arms", "ratios", "invalid_runs", ATTEMPTS_TABLE, "claims")
# Written only for an experiment whose arms are a release series.
RELEASE_TABLE = "releases"
# Written by the thread x quota map's own rule (thread_quota_map.py) when configured.
MAP_TABLE = "thread_quota_map"
MAP_CONTRAST_TABLE = "thread_quota_map_contrast"
MAP_BY_QUOTA_TABLE = "thread_quota_map_by_quota"
MAP_TABLES = (MAP_TABLE, MAP_CONTRAST_TABLE, MAP_BY_QUOTA_TABLE)

# How each table that is not always there reads back.
BLANK_IS_MISSING = {"keep_default_na": False, "na_values": [""]}
OPTIONAL_TABLES = {
    # Release names stay text: "1.10" is not the number 1.1.
    RELEASE_TABLE: {"dtype": {"release": str, "compared_with": str, "arm": str}},
    FIXES_TABLE: BLANK_IS_MISSING,
    # Quotas stay text: "none" sits beside numbers of cores.
    MAP_TABLE: {"dtype": {"variant": str, "cpu_quota": str, "invalid_reason": str}},
    MAP_CONTRAST_TABLE: {
        "dtype": {"cpu_quota": str, "block_ratios": str},
        **BLANK_IS_MISSING,
    },
    MAP_BY_QUOTA_TABLE: {"dtype": {"cpu_quota": str}, **BLANK_IS_MISSING},
    # Written by the client cross-check's own rule (crosscheck_table.py).
    CROSSCHECK_TABLE: {"dtype": {"arm": str}, **BLANK_IS_MISSING},
    CROSSCHECK_RUNS_TABLE: {"dtype": {"invalid_reasons": str}, **BLANK_IS_MISSING},
}


def aggregate(
    metrics_paths: Iterable[Path],
    config: dict,
    attempts_paths: Iterable[Path] = (),
    provenance_paths: Iterable[Path] = (),
) -> dict[str, pd.DataFrame]:
    """Read every run's metrics.json (and the attempts.json and provenance.json
    beside each, when given) and build the tables."""
    metrics_paths = [Path(path) for path in metrics_paths]
    attempts_paths, provenance_paths = list(attempts_paths), list(provenance_paths)
    records = [json.loads(path.read_text(encoding="utf-8")) for path in metrics_paths]
    if provenance_paths:
        # A provenance written before runs recorded their node has no flags.
        provenances = read_beside(metrics_paths, provenance_paths)
        records = [
            {**record, NODE_FLAG: provenance.get(NODE_FLAG, [])}
            for record, provenance in zip(records, provenances, strict=True)
        ]
    listings = read_beside(metrics_paths, attempts_paths) if attempts_paths else None
    return tables_from_metrics(records, config, listings)


def read_beside(metrics_paths: list[Path], paths: Iterable[Path]) -> list:
    """The JSON in each run's file of ``paths``, which lies beside that run's
    metrics.json: the two lists name the runs in the same order."""
    loaded = []
    for metrics, path in zip(metrics_paths, paths, strict=True):
        if Path(path).parent != metrics.parent:
            raise ValueError(
                f"{path} is not beside {metrics}: a run's files must come in the "
                "order of the runs' metrics"
            )
        loaded.append(json.loads(Path(path).read_text(encoding="utf-8")))
    return loaded


def tables_from_metrics(
    records: list[dict], config: dict, listings: list[list[dict]] | None = None
) -> dict[str, pd.DataFrame]:
    """Build the tables from metrics records and, when given, each run's
    attempts.json in the same order (see the module docstring)."""
    check_claims(config)
    if listings is None:
        listings = [[] for _ in records]
    tried = [tries(listing) for listing in listings]
    runs = runs_table([r | t for r, t in zip(records, tried, strict=True)], config)
    arms = arms_table(runs, config)
    tables = {
        "runs": runs,
        "arms": arms,
        "ratios": ratios_table(runs, arms, config),
        "invalid_runs": invalid_runs_table(runs),
        ATTEMPTS_TABLE: attempts_table(records, listings, config),
        "claims": claims_table(runs, arms, config),
    }
    if config.get("fixes"):
        tables[FIXES_TABLE] = fixes_table(arms, tables["claims"], config["fixes"])
    if config.get("release_series"):
        tables[RELEASE_TABLE] = releases_table(
            arms,
            runs,
            release_labels(config),
            ChangeCriterion.from_config(config.get("change_criterion")),
        )
    return tables


def write_tables(tables: dict[str, pd.DataFrame], out_dir: Path) -> list[Path]:
    """Write each table as `<name>.csv` under out_dir; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in (*TABLE_NAMES, RELEASE_TABLE, FIXES_TABLE):
        if name in tables:
            paths.append(out_dir / f"{name}.csv")
            tables[name].to_csv(paths[-1], index=False)
    return paths


def read_tables(in_dir: Path) -> dict[str, pd.DataFrame]:
    """Read back the tables written by `write_tables`, and the map's."""
    in_dir = Path(in_dir)
    tables = {}
    for name in TABLE_NAMES:
        try:
            tables[name] = pd.read_csv(in_dir / f"{name}.csv")
        except pd.errors.EmptyDataError:
            tables[name] = pd.DataFrame()
    for name, options in OPTIONAL_TABLES.items():
        path = in_dir / f"{name}.csv"
        # The map's rule writes its three tables together: with its cells read,
        # the other two must be there.
        if path.is_file() or (name in MAP_TABLES and MAP_TABLE in tables):
            tables[name] = pd.read_csv(path, **options)
    return tables
