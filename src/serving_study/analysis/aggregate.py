"""From every run's metrics to the study's tables, and the tables on disk.

Six tables come out, each written as CSV:

- `runs`: every run with every figure, valid or not, and the fields where the
  node it ran on differs from host.json (from its provenance.json).
- `arms`: per arm and figure, the median over valid runs, [min, max], the
  count of valid runs, a bootstrap 95% interval of the median when there are
  at least five valid runs, and the study's reference value.
- `ratios`: for each ratio claim, the ratio of the two arms' medians and the
  ratio within each repetition block (run k of one arm against run k of the
  other; every block runs every arm once, so drift hits both alike).
- `invalid_runs`: which runs were left out and why.
- `attempts`: each run's earlier attempts, superseded or failed outside the
  arm, from its attempts.json (attempts.py); never in a median.
- `claims`: one verdict per claim of the config: holds, does not hold, or
  cannot tell when an arm has too few valid runs.
- `releases` (only when the config sets `release_series`): each release
  against the one before it, and the first that changed (release_change.py).
- `fixes` (only when the config sets `fixes`): each fix beside the trap, with
  its throughput under the quota and its CPU cost without one
  (fix_comparison.py).

The runs and arms come from summaries.py, the ratios and verdicts from
claims.py; this module puts the tables together and reads and writes them.
A run's attempts.json and provenance.json lie beside its metrics.json and come
in the same order.
"""

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from serving_study.analysis.attempts import ATTEMPTS_TABLE, attempts_table
from serving_study.analysis.claims import check_claims, claims_table, ratios_table
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
    records = load_metrics(metrics_paths)
    if provenance_paths:
        provenances = read_beside(metrics_paths, provenance_paths)
        records = with_node_flags(records, provenances)
    listings = read_beside(metrics_paths, attempts_paths) if attempts_paths else None
    return tables_from_metrics(records, config, listings)


def load_metrics(metrics_paths: Iterable[Path]) -> list[dict]:
    return [
        json.loads(Path(path).read_text(encoding="utf-8")) for path in metrics_paths
    ]


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


def with_node_flags(records: list[dict], provenances: list[dict]) -> list[dict]:
    """Each run's metrics with its provenance's node_differs_from_host (empty in
    a provenance written before runs recorded their node)."""
    return [
        {**record, NODE_FLAG: provenance.get(NODE_FLAG, [])}
        for record, provenance in zip(records, provenances, strict=True)
    ]


def tables_from_metrics(
    records: list[dict], config: dict, listings: list[list[dict]] | None = None
) -> dict[str, pd.DataFrame]:
    """Build the tables from metrics records and, when given, each run's
    attempts.json in the same order (see the module docstring)."""
    check_claims(config)
    runs = runs_table(records, config)
    arms = arms_table(runs, config)
    if listings is None:
        listings = [[] for _ in records]
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
        if name not in tables:
            continue
        path = out_dir / f"{name}.csv"
        tables[name].to_csv(path, index=False)
        paths.append(path)
    return paths


def read_tables(in_dir: Path) -> dict[str, pd.DataFrame]:
    """Read back the tables written by `write_tables`."""
    tables = {}
    for name in TABLE_NAMES:
        path = Path(in_dir) / f"{name}.csv"
        try:
            tables[name] = pd.read_csv(path)
        except pd.errors.EmptyDataError:
            tables[name] = pd.DataFrame()
    releases = Path(in_dir) / f"{RELEASE_TABLE}.csv"
    if releases.is_file():
        # Release names stay text: "1.10" is not the number 1.1.
        names = {"release": str, "compared_with": str, "arm": str}
        tables[RELEASE_TABLE] = pd.read_csv(releases, dtype=names)
    fixes = Path(in_dir) / f"{FIXES_TABLE}.csv"
    if fixes.is_file():
        tables[FIXES_TABLE] = pd.read_csv(fixes, keep_default_na=False, na_values=[""])
    cells = Path(in_dir) / f"{MAP_TABLE}.csv"
    if cells.is_file():
        # Quotas stay text: "none" sits beside numbers of cores.
        tables[MAP_TABLE] = pd.read_csv(
            cells, dtype={"variant": str, "cpu_quota": str, "invalid_reason": str}
        )
        contrast = Path(in_dir) / f"{MAP_CONTRAST_TABLE}.csv"
        tables[MAP_CONTRAST_TABLE] = pd.read_csv(
            contrast,
            dtype={"cpu_quota": str, "block_ratios": str},
            keep_default_na=False,
            na_values=[""],
        )
        by_quota = Path(in_dir) / f"{MAP_BY_QUOTA_TABLE}.csv"
        tables[MAP_BY_QUOTA_TABLE] = pd.read_csv(
            by_quota, dtype={"cpu_quota": str}, keep_default_na=False, na_values=[""]
        )
    return tables
