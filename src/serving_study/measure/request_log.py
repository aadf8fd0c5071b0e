"""The client's request log (requests.jsonl): reading it, and which requests count.

One JSON object per request (client.py lists the fields). Only measured requests
enter a run's figures; of those, only completed ones have a latency.
"""

import json
from collections.abc import Iterable
from pathlib import Path


def read_request_log(path: Path) -> list[dict]:
    """The client's per-request records, one JSON object per line."""
    records = []
    with open(path, encoding="utf-8") as log:
        for line_number, line in enumerate(log, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}:{line_number} is not a JSON object ({error}); "
                    "the request log must hold one JSON object per line"
                ) from error
    return records


def completed(record: dict) -> bool:
    """A request completed when it ended with a 2xx status and no error."""
    status = record.get("status")
    return (
        record.get("error") is None
        and record.get("end_s") is not None
        and status is not None
        and 200 <= status < 300
    )


def measured(records: Iterable[dict]) -> list[dict]:
    return [record for record in records if record.get("phase") == "measured"]


def values_of(records: list[dict], key: str) -> list[float]:
    """The records' values of `key`, as floats, where they have one."""
    return [float(r[key]) for r in records if r.get(key) is not None]
