"""What the preflight doctor prescribes when an arm walks into the study's trap.

The trap: PyTorch sizes its OpenMP pool from the visible CPUs, not from the CPU
quota, so a server with many more intra-op threads than quota cores spends its
quota on idle workers that spin. Each fix below removes that, and each has a cost
somewhere else; where this project has measured a fix (a results page's
``tables/fixes.csv``, written by the workflow), the prescription says what it
measured.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

# Where the workflow's published fixes tables live (one per results page).
FIXES_TABLES = "docs/results/*/tables/fixes.csv"


@dataclass(frozen=True)
class Fix:
    name: str  # as experiments' fixes sections name it, up to the parenthesis
    setting: str
    cost: str  # what it costs, in general terms


def fixes_for(quota_cores: float) -> tuple[Fix, ...]:
    cap = max(1, math.floor(quota_cores))
    return (
        Fix(
            "thread cap",
            f"OMP_NUM_THREADS={cap} in the arm's environment",
            "every torch op in the server runs on at most that many threads",
        ),
        Fix(
            "patch",
            "PR #48881 (the copy into shared memory without torch's thread pool)",
            "a new SGLang release or a patched build",
        ),
        Fix(
            "passive wait",
            "OMP_WAIT_POLICY=PASSIVE",
            "idle workers sleep at once, so each parallel op pays a wake-up",
        ),
        Fix(
            "no spin",
            "GOMP_SPINCOUNT=0 (GNU OpenMP)",
            "as the passive policy, for GNU OpenMP only",
        ),
    )


def published_fixes_tables(results_folders: list[str]) -> list[Path]:
    """The fixes tables of the results pages in ``results_folders`` (the
    workflow's docs/results, when there is one)."""
    return sorted(
        table
        for folder in results_folders
        for table in Path(folder).glob("*/tables/fixes.csv")
    )


def measured_costs(fixes_tables: list[Path]) -> dict[str, list[str]]:
    """Per fix name (its first words), what each results page measured:
    "<experiment>: 2.00x the trap's throughput, 31 ms main-process CPU per
    request without a quota"."""
    found: dict[str, list[str]] = {}
    for table in sorted(Path(path) for path in fixes_tables):
        experiment = table.parent.parent.name
        with open(table, newline="") as rows:
            for row in csv.DictReader(rows):
                key = row["fix"].split(" (")[0]
                parts = []
                throughput = _number(row.get("throughput_vs_trap"))
                if throughput is not None:
                    parts.append(f"{throughput:.2f}x the trap's throughput")
                main_cpu = _number(row.get("main_cpu_ms_per_request_without_quota"))
                if main_cpu is not None:
                    parts.append(
                        f"{main_cpu:.0f} ms main-process CPU per request without a "
                        "quota"
                    )
                if parts:
                    found.setdefault(key, []).append(
                        f"{experiment}: {', '.join(parts)}"
                    )
    return found


def _number(text: str | None) -> float | None:
    """A table cell's number; None when it is empty (a fix not measured there)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def prescription(threads: int, quota_cores: float, fixes_tables: list[Path]) -> str:
    """The doctor's note for an arm with ``threads`` intra-op threads under a
    ``quota_cores`` quota: every fix, its cost, and what the published fixes
    tables measured of it."""
    measured = measured_costs(fixes_tables)
    lines = [
        f"{threads} intra-op threads under a {quota_cores:g}-core quota: idle "
        "OpenMP workers spin on the quota. Fixes:"
    ]
    for fix in fixes_for(quota_cores):
        seen = measured.get(fix.name)
        note = "; ".join(seen) if seen else "not measured by this project yet"
        lines.append(
            f"  - {fix.name}: {fix.setting}. Cost: {fix.cost}. Measured: {note}"
        )
    lines.append(
        "The report's section 'Which fix' compares them on this host when the "
        "experiment has a fixes section (config/config.yaml has one)."
    )
    return "\n".join(lines)
