"""The earlier attempts at each run: superseded or failed outside the arm.

Every run lists its attempts in its attempts.json (measure/run_attempts.py). The
current one is the run: its files are the run's outputs and its figures are in the
runs table, beside how many tries the job that made it took and why (``tries``).
The others stay on disk under results/<experiment>/attempts/ and are listed here,
one row each, for the reader; none of them enters a median.
"""

import pandas as pd

from serving_study.analysis.summaries import in_config_order
from serving_study.measure.run_attempts import CURRENT_OUTCOME

ATTEMPTS_TABLE = "attempts"
ATTEMPT_COLUMNS = (
    "arm",
    "run",
    "attempt",
    "outcome",
    "valid",
    "throughput_rps",
    "reasons",
)


def attempts_table(
    records: list[dict], listings: list[list[dict]], config: dict
) -> pd.DataFrame:
    """One row per attempt that is not its run's current one, in the config's
    order of arms; ``listings[i]`` is the attempts.json of the run whose metrics
    are ``records[i]``."""
    rows = [
        {
            "arm": record.get("arm"),
            "run": record.get("run"),
            "attempt": entry["attempt"],
            "outcome": entry["outcome"],
            "valid": bool(entry.get("valid")),
            "throughput_rps": entry.get("throughput_rps"),
            "reasons": "; ".join(entry.get("invalid_reasons") or []),
        }
        for record, listing in zip(records, listings, strict=True)
        for entry in listing
        if entry["outcome"] != CURRENT_OUTCOME
    ]
    table = pd.DataFrame(rows, columns=list(ATTEMPT_COLUMNS))
    table["throughput_rps"] = pd.to_numeric(table["throughput_rps"]).astype(float)
    return in_config_order(table, config)


def tries(listing: list[dict]) -> dict:
    """How many attempts the job that made the run's current attempt took, and
    the reasons of those that failed; a run listed before attempts named their
    job took one."""
    current = next((e for e in listing if e["outcome"] == CURRENT_OUTCOME), {})
    job = current.get("job")
    earlier = [
        entry
        for entry in listing
        if job and entry.get("job") == job and entry is not current
    ]
    return {
        "attempts": 1 + len(earlier),
        "retried_because": " | ".join(
            "; ".join(entry.get("invalid_reasons") or []) for entry in earlier
        ),
    }
