"""Jobs run in randomised complete blocks, reproducibly from the seed."""

from serving_study.config.arm_order import block_order, execution_order, priority

ARMS = {"A": 3, "B": 3, "C": 3, "D": 3}


def test_each_block_measures_every_arm_once_before_the_next_block():
    order = execution_order(ARMS, seed=1)
    assert len(order) == 12
    for block in range(3):
        chunk = order[block * 4 : block * 4 + 4]
        assert sorted(arm for arm, _ in chunk) == ["A", "B", "C", "D"]
        assert {run for _, run in chunk} == {block + 1}


def test_blocks_are_shuffled_differently_and_reproducibly():
    orders = [tuple(block_order(ARMS, seed=1, run=run)) for run in (1, 2, 3)]
    assert len(set(orders)) > 1
    assert orders == [tuple(block_order(ARMS, seed=1, run=run)) for run in (1, 2, 3)]
    assert block_order(ARMS, seed=1, run=1) != block_order(ARMS, seed=2, run=1) or (
        block_order(ARMS, seed=1, run=2) != block_order(ARMS, seed=2, run=2)
    )


def test_priorities_follow_the_order():
    order = execution_order(ARMS, seed=5)
    priorities = [priority(ARMS, 5, arm, run) for arm, run in order]
    assert priorities == sorted(priorities, reverse=True)
    assert len(set(priorities)) == len(priorities)


def test_arms_with_fewer_runs_leave_later_blocks():
    order = execution_order({"A": 1, "B": 2}, seed=3)
    assert sorted(order) == [("A", 1), ("B", 1), ("B", 2)]
    assert order[-1] == ("B", 2)
