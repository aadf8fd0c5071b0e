"""One run per arm over its measured window: each request's TTFT at the moment it
was sent, and the main process's CPU and the quota cgroup's throttled share from
the monitors' series (monitors.json, sampled at 10 Hz), as the report draws them.

**Which run.** An arm's representative run is its valid run whose throughput is the
median of its valid runs' throughput: with an odd count that is one of them; with
an even count the one nearest the median, the earlier run where two are as near.
Invalid runs are never representative; an arm without a valid run has none.

**The time axis** is seconds since the measured window opened. The monitors open it
just before the first measured request is sent (measure/run_window.py), so a
request's time is its send time less the first measured request's, and a sample's
time is the monitors' own ``t``.

**The series are downsampled.** Each monitor sample covers the 0.1 s before its
``t``; samples are averaged over ``BIN_SECONDS`` bins, weighted by the time each
covers, and drawn at the bin's middle. For CPU that is the process's CPU over the
bin. A sample's throttled share is its throttled periods over its periods of the
cgroup's quota (0, 1 or none at 10 Hz with a 100 ms period), so the bin's mean is
about the share of the bin's periods that were throttled; a sample without a
period (no quota, or an idle cgroup) is left out.
"""

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from serving_study.measure.request_log import completed, measured, read_request_log

REPRESENTATIVE_RUNS = "representative_runs"
RUN_TIMELINES = "run_timelines"
BIN_SECONDS = 0.5
TTFT = "ttft_ms"
MAIN_CPU = "main_cpu_percent"
THROTTLED = "throttled_share"
SERIES = (TTFT, MAIN_CPU, THROTTLED)
MONITOR_FIELDS = {MAIN_CPU: "main_cpu_percent", THROTTLED: "cgroup_throttled_share"}


def representative_runs(runs: pd.DataFrame, arm_names: Sequence[str]) -> pd.DataFrame:
    """Per arm, in ``arm_names``' order: the run chosen and why (module docstring);
    ``run`` is empty for an arm without a valid run."""
    rows = []
    for arm in arm_names:
        arm_runs = runs[runs["arm"] == arm]
        valid = arm_runs[arm_runs["valid"].astype(bool)]
        valid = valid[valid["throughput_rps"].notna()].sort_values("run")
        row = {"arm": arm, "valid_runs": len(valid), "runs": len(arm_runs)}
        if valid.empty:
            rows.append(
                row | {"run": math.nan, "throughput_rps": math.nan, "median": math.nan}
            )
            continue
        median = float(valid["throughput_rps"].median())
        distance = (valid["throughput_rps"] - median).abs()
        # Two runs are as near when they differ only in rounding, as the two
        # runs either side of an even count's median do.
        nearest = distance <= distance.min() + 1e-9 * abs(median)
        chosen = valid[nearest].iloc[0]
        rows.append(
            row
            | {
                "run": int(chosen["run"]),
                "throughput_rps": float(chosen["throughput_rps"]),
                "median": median,
            }
        )
    table = pd.DataFrame(
        rows, columns=["arm", "run", "valid_runs", "runs", "throughput_rps", "median"]
    )
    table["run"] = table["run"].astype("Int64")
    table["chosen_because"] = [why_chosen(row) for row in table.to_dict("records")]
    return table


def why_chosen(row: dict) -> str:
    """ "run 2: 14.6 req/s, the median of 3 valid runs", or why there is none."""
    if pd.isna(row["run"]):
        return f"no valid run of {row['runs']}: nothing drawn"
    count = row["valid_runs"]
    runs = f"{count} valid run{'s' if count != 1 else ''}"
    if row["throughput_rps"] == row["median"]:
        where = f"the median of {runs}"
    else:
        where = f"nearest the median {row['median']:.3g} of {runs}"
    return f"run {row['run']}: {row['throughput_rps']:.3g} req/s, {where}"


def request_series(requests: Path) -> pd.DataFrame:
    """Each completed measured request's TTFT at its send time, from the first
    measured send on (columns t_s, value)."""
    records = measured(read_request_log(requests))
    if not records:
        return pd.DataFrame(columns=["t_s", "value"])
    start = min(record["sent_s"] for record in records)
    points = [
        {"t_s": record["sent_s"] - start, "value": float(record[TTFT])}
        for record in records
        if completed(record) and record.get(TTFT) is not None
    ]
    return pd.DataFrame(points, columns=["t_s", "value"])


def monitor_series(monitors: Path, field: str) -> pd.DataFrame:
    """A monitor series averaged over BIN_SECONDS bins, each weighted by the time
    its samples cover (columns t_s, the bin's middle, and value)."""
    samples = json.loads(monitors.read_text(encoding="utf-8")).get("series") or []
    rows, previous = [], 0.0
    for sample in samples:
        start, end = previous, float(sample["t"])
        previous = end
        if sample.get(field) is None or end <= start:
            continue
        middle = (start + end) / 2
        rows.append(
            {"bin": int(middle // BIN_SECONDS), "seconds": end - start}
            | {"weighted": float(sample[field]) * (end - start)}
        )
    if not rows:
        return pd.DataFrame(columns=["t_s", "value"])
    bins = pd.DataFrame(rows).groupby("bin")[["seconds", "weighted"]].sum()
    return pd.DataFrame(
        {
            "t_s": (bins.index + 0.5) * BIN_SECONDS,
            "value": bins["weighted"] / bins["seconds"],
        }
    ).reset_index(drop=True)


def run_timelines(
    runs: pd.DataFrame,
    arm_names: Sequence[str],
    requests_paths: Sequence[Path],
    monitors_paths: Sequence[Path],
) -> dict[str, pd.DataFrame]:
    """The representative runs and their series (arm, run, series, t_s, value).

    ``requests_paths`` and ``monitors_paths`` hold every run's requests.jsonl and
    monitors.json, each in its run's folder ``<arm>/run<k>/``."""
    chosen = representative_runs(runs, arm_names)
    requests = run_files(requests_paths)
    monitors = run_files(monitors_paths)
    parts = []
    for row in chosen.dropna(subset=["run"]).to_dict("records"):
        key = (row["arm"], int(row["run"]))
        series = {TTFT: request_series(requests[key])}
        for name, field in MONITOR_FIELDS.items():
            series[name] = monitor_series(monitors[key], field)
        parts += [
            frame.assign(arm=key[0], run=key[1], series=name)
            for name, frame in series.items()
            if not frame.empty
        ]
    columns = ["arm", "run", "series", "t_s", "value"]
    timelines = (
        pd.concat(parts, ignore_index=True)[columns]
        if parts
        else pd.DataFrame(columns=columns)
    )
    return {REPRESENTATIVE_RUNS: chosen, RUN_TIMELINES: timelines}


def run_files(paths: Sequence[Path]) -> dict[tuple[str, int], Path]:
    """Each file keyed by its run: (arm, k) from its folder ``<arm>/run<k>/``."""
    keyed = {}
    for path in map(Path, paths):
        folder = path.parent
        if not folder.name.startswith("run") or not folder.name[3:].isdigit():
            raise ValueError(f"{path} is not in a run's folder <arm>/run<k>/")
        keyed[(folder.parent.name, int(folder.name[3:]))] = path
    return keyed
