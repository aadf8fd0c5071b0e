"""Which fix to deploy: every fix beside the trap it removes, and what it costs.

A config's ``fixes`` section names the arm that shows the trap (the original copy
with default threads under the quota) and, for each fix, the arm that applies it
under the same quota; optionally, for each, an arm of the same settings without a
quota. The table this module builds puts, for each fix:

- throughput under the quota, and its ratio to the trap's;
- TTFT p50 under the quota;
- the main process's CPU per request under the quota, which shows a fix that
  slows the main process's own parallel work (its image preprocessing, say);
- where the main process's CPU goes under the quota: its event-loop thread
  against its other threads (the intra-op OpenMP team), which is the root cause
  shown rather than asserted;
- the main process's CPU per request without a quota, where nothing throttles
  and a spinning thread pool costs the host CPU instead of throughput;
- the verdicts of the claims the config states about the fix's arms.

The figures are medians of valid runs from the ``arms`` table, the verdicts come
from the ``claims`` table; nothing is computed here that the two do not hold.
"""

import pandas as pd

FIXES_TABLE = "fixes"
TRAP = "none (the trap)"
COLUMNS = (
    "fix",
    "arm",
    "throughput_rps",
    "throughput_vs_trap",
    "ttft_p50_ms",
    "main_cpu_ms_per_request",
    "main_thread_cpu_percent",
    "other_threads_cpu_percent",
    "without_quota_arm",
    "main_cpu_ms_per_request_without_quota",
    "throughput_rps_without_quota",
    "verdicts",
)


def fixes_table(arms: pd.DataFrame, claims: pd.DataFrame, fixes: dict) -> pd.DataFrame:
    """One row for the trap, then one per fix, in the config's order."""

    def median(arm: str | None, metric: str) -> float | None:
        if arm is None or arms.empty:
            return None
        row = arms[(arms["arm"] == arm) & (arms["metric"] == metric)]
        if row.empty or pd.isna(row["median"].iloc[0]):
            return None
        return float(row["median"].iloc[0])

    entries = [{"name": TRAP, **fixes["baseline"]}, *fixes["fixes"]]
    trap_throughput = median(fixes["baseline"]["arm"], "throughput_rps")
    rows = []
    for entry in entries:
        arm, free_arm = entry["arm"], entry.get("without_quota")
        throughput = median(arm, "throughput_rps")
        vs_trap = None
        if throughput is not None and trap_throughput:
            vs_trap = throughput / trap_throughput
        rows.append(
            {
                "fix": entry["name"],
                "arm": arm,
                "throughput_rps": throughput,
                "throughput_vs_trap": vs_trap,
                "ttft_p50_ms": median(arm, "ttft_p50_ms"),
                "main_cpu_ms_per_request": median(arm, "main_cpu_ms_per_request"),
                "main_thread_cpu_percent": median(arm, "main_thread_cpu_percent"),
                "other_threads_cpu_percent": median(arm, "other_threads_cpu_percent"),
                "without_quota_arm": free_arm,
                "main_cpu_ms_per_request_without_quota": median(
                    free_arm, "main_cpu_ms_per_request"
                ),
                "throughput_rps_without_quota": median(free_arm, "throughput_rps"),
                "verdicts": _verdicts(claims, {arm, free_arm} - {None}),
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _verdicts(claims: pd.DataFrame, arms: set[str]) -> str:
    """The claims about ``arms``: a ratio claim whose numerator is one of them, a
    "within" claim that names one of them; each as "name: verdict (detail)"."""
    if claims.empty:
        return ""
    found = []
    for claim in claims.itertuples():
        named = str(claim.arms).split(", ")
        about = named[:1] if claim.kind == "ratio" else named
        if arms & set(about):
            found.append(f"{claim.claim}: {claim.verdict} ({claim.detail})")
    return "; ".join(found)


def fixes_chart_spec(table: pd.DataFrame) -> dict:
    """Throughput under the quota for the trap and each fix, one bar each, with
    the ratio to the trap as the bar's label."""
    values = [
        {
            "fix": row.fix,
            "kind": "trap" if row.fix == TRAP else "fix",
            "throughput_rps": row.throughput_rps,
            "label": (
                f"{row.throughput_vs_trap:.2f}x"
                if pd.notna(row.throughput_vs_trap)
                else ""
            ),
        }
        for row in table.itertuples()
        if pd.notna(row.throughput_rps)
    ]
    order = [value["fix"] for value in values]
    encoding_y = {"field": "fix", "type": "nominal", "sort": order, "title": None}
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": "Throughput under the quota, by fix (median of valid runs)",
        "data": {"values": values},
        "width": 420,
        "layer": [
            {
                "mark": "bar",
                "encoding": {
                    "y": encoding_y,
                    "x": {
                        "field": "throughput_rps",
                        "type": "quantitative",
                        "title": "req/s",
                    },
                    "color": {
                        "field": "kind",
                        "type": "nominal",
                        "scale": {"domain": ["trap", "fix"], "range": ["#b44", "#48a"]},
                        "legend": None,
                    },
                },
            },
            {
                "mark": {"type": "text", "align": "left", "dx": 4},
                "encoding": {
                    "y": encoding_y,
                    "x": {"field": "throughput_rps", "type": "quantitative"},
                    "text": {"field": "label"},
                },
            },
        ],
    }
