"""The files of one run, and how its JSON ones are written.

A run leaves its metrics, its request log, the monitors' figures, its provenance
and its server's log. JSON is written indented, with anything JSON cannot hold
written as its text.
"""

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    metrics: Path
    requests: Path
    monitors: Path
    provenance: Path
    server_log: Path

    @classmethod
    def in_directory(cls, directory: Path) -> "RunPaths":
        """The usual file names of one run inside ``directory``."""
        return cls(
            metrics=directory / "metrics.json",
            requests=directory / "requests.jsonl",
            monitors=directory / "monitors.json",
            provenance=directory / "provenance.json",
            server_log=directory / "server.log",
        )


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def now_iso() -> str:
    """This moment in UTC, to the second, as a run's provenance records it."""
    return datetime.now(UTC).isoformat(timespec="seconds")
