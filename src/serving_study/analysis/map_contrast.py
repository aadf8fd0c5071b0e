"""The thread x quota map's variant contrast, stated with its paired blocks.

Each block of the map measures every cell once, and within a block both variants'
cells of one thread count run side by side within seconds of each other. A
contrast is therefore the median of per-block ratios (compared over baseline, the
same thread count and quota, the same block), never a ratio of medians taken at
different times; the blocks on each side of 1 say how firm it is. Per quota, the
contrast is also summed up over every thread count (``contrast_by_quota``).
"""

import pandas as pd

from serving_study.config.records import quota_cores

# How many blocks a contrast pairs, and how many of their ratios fall below or above 1.
BLOCK_COUNTS = ("paired_blocks", "blocks_below_1", "blocks_above_1")
CONTRAST_COLUMNS = (
    "intra_op_threads",
    "cpu_quota",
    "baseline",
    "compared",
    "baseline_rps",
    "compared_rps",
    "ratio",
    *BLOCK_COUNTS,
    "block_ratios",
)

BY_QUOTA_COLUMNS = (
    "cpu_quota",
    "baseline",
    "compared",
    "thread_counts",
    "ratio_min",
    "ratio_max",
    "threads_at_max",
    *BLOCK_COUNTS,
)


def quota_order(quotas) -> list[str]:
    """Quotas from the smallest to none (no quota)."""
    numbers = sorted({q for q in quotas if quota_cores(q) is not None}, key=float)
    return numbers + [q for q in dict.fromkeys(quotas) if quota_cores(q) is None]


def cell_medians(cells: pd.DataFrame) -> pd.DataFrame:
    """Each (variant, threads, quota) cell's median throughput over its valid
    blocks (cells without a valid block are left out)."""
    valid = cells[cells["valid"].astype(bool)]
    by_cell = valid.groupby(["variant", "intra_op_threads", "cpu_quota"], sort=False)
    return by_cell["throughput_rps"].median().reset_index()


def map_contrast(cells: pd.DataFrame, variants: list[str]) -> pd.DataFrame:
    """Every other variant against the first, per (threads, quota), paired within
    blocks. A block counts only where both cells of the pair are valid."""
    cells = cells.assign(cpu_quota=cells["cpu_quota"].astype(str))
    valid = cells[cells["valid"].astype(bool)]
    by_block = valid.pivot_table(
        index=["intra_op_threads", "cpu_quota", "block"],
        columns="variant",
        values="throughput_rps",
    )
    medians = cell_medians(cells).set_index(
        ["variant", "intra_op_threads", "cpu_quota"]
    )["throughput_rps"]
    baseline, *others = variants
    quotas = quota_order(cells["cpu_quota"])
    lines = []
    for compared in others:
        for threads in sorted({int(t) for t in cells["intra_op_threads"]}):
            for quota in quotas:
                ratios = paired_ratios(by_block, threads, quota, baseline, compared)
                lines.append(
                    {
                        "intra_op_threads": threads,
                        "cpu_quota": quota,
                        "baseline": baseline,
                        "compared": compared,
                        "baseline_rps": medians.get((baseline, threads, quota)),
                        "compared_rps": medians.get((compared, threads, quota)),
                        "ratio": ratios.median() if len(ratios) else None,
                        "paired_blocks": len(ratios),
                        "blocks_below_1": int((ratios < 1).sum()),
                        "blocks_above_1": int((ratios > 1).sum()),
                        "block_ratios": ";".join(f"{r:.3f}" for r in ratios),
                    }
                )
    return pd.DataFrame(lines, columns=list(CONTRAST_COLUMNS))


def paired_ratios(
    by_block: pd.DataFrame, threads: int, quota: str, baseline: str, compared: str
) -> pd.Series:
    """compared / baseline in each block where both were measured validly."""
    if baseline not in by_block or compared not in by_block:
        return pd.Series(dtype=float)
    try:
        pairs = by_block.loc[(threads, quota)]
    except KeyError:
        return pd.Series(dtype=float)
    ratios = (pairs[compared] / pairs[baseline]).dropna()
    return ratios.sort_index().reset_index(drop=True)


def contrast_by_quota(contrast: pd.DataFrame) -> pd.DataFrame:
    """The contrast summed up per quota, over every thread count: the range of the
    cells' paired ratios, the thread count where the compared variant gains most,
    and how many of all the paired block ratios fall on each side of 1."""
    lines = []
    measured = contrast.dropna(subset=["ratio"])
    for (baseline, compared), pairs in measured.groupby(
        ["baseline", "compared"], sort=False
    ):
        for quota in quota_order(pairs["cpu_quota"]):
            cells = pairs[pairs["cpu_quota"] == quota]
            best = cells.loc[cells["ratio"].idxmax()]
            lines.append(
                {
                    "cpu_quota": quota,
                    "baseline": baseline,
                    "compared": compared,
                    "thread_counts": len(cells),
                    "ratio_min": cells["ratio"].min(),
                    "ratio_max": cells["ratio"].max(),
                    "threads_at_max": int(best["intra_op_threads"]),
                    **{count: int(cells[count].sum()) for count in BLOCK_COUNTS},
                }
            )
    return pd.DataFrame(lines, columns=list(BY_QUOTA_COLUMNS))
