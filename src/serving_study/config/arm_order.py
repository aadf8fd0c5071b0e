"""The order in which (arm, run) jobs execute: randomised complete blocks.

Run block k measures every arm once, in an order shuffled by the config's seed and
k, before block k + 1 starts. Drift on the host (thermal state, page cache,
neighbours) then hits every arm alike, and the same seed gives the same order on
any host. Snakemake executes higher priorities first, so the order becomes one
priority number per job.
"""

import random


def block_order(arm_runs: dict[str, int], seed: int, run: int) -> list[str]:
    """The arms measured in run block ``run``, in execution order."""
    names = sorted(name for name, runs in arm_runs.items() if runs >= run)
    random.Random(f"{seed}-block-{run}").shuffle(names)
    return names


def execution_order(arm_runs: dict[str, int], seed: int) -> list[tuple[str, int]]:
    blocks = max(arm_runs.values())
    return [
        (arm, run)
        for run in range(1, blocks + 1)
        for arm in block_order(arm_runs, seed, run)
    ]


def priority(arm_runs: dict[str, int], seed: int, arm: str, run: int) -> int:
    """A Snakemake priority: the first job of the whole order gets the highest."""
    order = execution_order(arm_runs, seed)
    return len(order) - order.index((arm, run))
