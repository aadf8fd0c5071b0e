"""Rate-driven load: the seeded arrival process, and the client sending it to a real
HTTP server under a maximum concurrency."""

import asyncio
import json
import math

import numpy as np
import pytest
from study_helpers import arm_record
from test_client import FakeServer, read_log, run_against, write_workload

from serving_study.analysis.summaries import arms_table, runs_table
from serving_study.config.records import Arm
from serving_study.measure.arrivals import ArrivalSchedule, arrival_schedule
from serving_study.measure.chat_requests import load_requests
from serving_study.report.arm_charts import series_labels

GAPS = 20_000  # gaps drawn per burstiness: the tolerances below shrink as 1/sqrt(n)
RATE = 8.0


def gaps_of(burstiness: float, *, seed: int = 5, block: int = 1) -> np.ndarray:
    schedule = ArrivalSchedule.drawn(
        request_rate=RATE, burstiness=burstiness, seed=seed, block=block, count=GAPS + 1
    )
    assert schedule.times_s[0] == 0.0
    return np.diff(schedule.times_s)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_the_gaps_have_the_rate_and_the_spread_gamma_gives_them(burstiness):
    """Gamma gaps of shape b and mean 1/rate have a coefficient of variation of
    1/sqrt(b). Each is checked within four standard errors of its estimate for
    this many gaps (the seed is fixed, so the draws never change)."""
    gaps = gaps_of(burstiness)
    variation = 1 / math.sqrt(burstiness)
    # The sample mean's standard error is the gaps' standard deviation / sqrt(n).
    mean_error = variation / math.sqrt(GAPS)
    assert abs(gaps.mean() * RATE - 1) <= 4 * mean_error
    # The sample standard deviation's relative error is sqrt((2 + excess kurtosis)
    # / 4n), the gamma's excess kurtosis 6/b; the mean's adds to it in the ratio.
    spread_error = math.sqrt(((2 + 6 / burstiness) / 4 + variation**2) / GAPS)
    measured = gaps.std(ddof=1) / gaps.mean()
    assert abs(measured / variation - 1) <= 4 * spread_error


def test_burstiness_below_one_bunches_the_arrivals_and_above_one_evens_them():
    gaps = {b: gaps_of(b) for b in (0.25, 1.0, 4.0)}
    variation = {b: gaps[b].std() / gaps[b].mean() for b in gaps}
    assert variation[0.25] > 1.9 and 0.95 < variation[1.0] < 1.05
    assert variation[4.0] < 0.55


def test_the_same_seed_and_block_give_the_same_times_and_other_ones_others():
    def times(**changes):
        settings = {"request_rate": 4.0, "burstiness": 1.0, "seed": 3, "block": 1}
        return ArrivalSchedule.drawn(**(settings | changes), count=50).times_s

    assert times() == times()
    assert times() != times(block=2)
    assert times() != times(seed=4)
    # Every arm of a block sees one pattern: a faster rate only compresses it,
    # and an arm with fewer requests gets the first of the same times.
    assert np.allclose(times(request_rate=8.0), np.array(times()) / 2)
    assert (
        ArrivalSchedule.drawn(
            request_rate=4.0, burstiness=1.0, seed=3, block=1, count=20
        ).times_s
        == times()[:20]
    )


def test_an_arm_with_a_rate_draws_from_its_workloads_seed_and_a_closed_loop_none(
    tmp_path,
):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"seed": 11}))
    closed = arm_record(concurrency=4)
    assert arrival_schedule(closed, manifest, block=1, count=10) is None
    open_loop = arm_record(concurrency=4, request_rate=2.5, burstiness=0.5)
    schedule = arrival_schedule(open_loop, manifest, block=3, count=10)
    assert schedule == ArrivalSchedule.drawn(
        request_rate=2.5, burstiness=0.5, seed=11, block=3, count=10
    )
    assert open_loop.load == "2.5 req/s (burstiness 0.5), at most 4 in flight"
    assert closed.load == "closed loop, 4 in flight"
    # A closed loop's params are what they were before open loops: no run measured
    # then is measured again. An open loop's carry both keys to its job.
    assert not {"request_rate", "burstiness"} & set(closed.as_config())
    assert open_loop.as_config()["burstiness"] == 0.5
    assert type(closed).from_config(open_loop.as_config()) == open_loop


def most_overlapping(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one moment (an end before a start that ties)."""
    starts = [(start, 1) for start, _ in intervals]
    ends = [(end, -1) for _, end in intervals]
    most = open_now = 0
    for _, change in sorted(starts + ends):
        open_now += change
        most = max(most, open_now)
    return most


def test_an_open_loop_sends_on_schedule_and_never_exceeds_its_concurrency(tmp_path):
    """40 arrivals at 100 req/s against a server that takes ~15 ms a request, at
    most two in flight: bursts find both slots busy and wait for one."""
    chat_requests = load_requests(write_workload(tmp_path))
    server = FakeServer(tokens=4)
    schedule = ArrivalSchedule.drawn(
        request_rate=100.0, burstiness=1.0, seed=1, block=1, count=40
    )
    summary = asyncio.run(
        run_against(
            server,
            chat_requests,
            tmp_path / "requests.jsonl",
            concurrency=2,
            measured_requests=36,
            warmup_requests=4,
            arrivals=schedule,
        )
    )
    records = read_log(tmp_path / "requests.jsonl")
    assert server.arrivals == 40 and server.most_in_flight <= 2
    assert most_overlapping([(r["sent_s"], r["end_s"]) for r in records]) <= 2
    assert [r["arrival_s"] for r in records] == [round(t, 6) for t in schedule.times_s]
    ends = {r["end_s"] for r in records}
    waited = 0
    for record in records:
        assert record["error"] is None
        # Due at its arrival, or later when a slot freed: never sent early.
        assert record["arrival_s"] <= record["scheduled_s"] <= record["sent_s"]
        if record["scheduled_s"] > record["arrival_s"]:
            assert record["scheduled_s"] in ends
            waited += 1
        lag = record["sent_s"] - record["scheduled_s"]
        assert record["dispatch_lag_ms"] == pytest.approx(lag * 1000, abs=0.002)
    assert waited > 0  # the cap bound: some arrivals found both slots busy
    # Sent in arrival order, each close to when it was due (the wait for a slot
    # is no dispatch lag).
    assert [r["sent_s"] for r in records] == sorted(r["sent_s"] for r in records)
    assert np.median([r["dispatch_lag_ms"] for r in records]) < 5
    assert summary.arrivals == schedule.record()
    assert summary.measured_ok == 36


def test_arrival_times_must_be_one_per_request(tmp_path):
    chat_requests = load_requests(write_workload(tmp_path, images=1))
    schedule = ArrivalSchedule.drawn(
        request_rate=1.0, burstiness=1.0, seed=1, block=1, count=3
    )
    with pytest.raises(ValueError, match="3 arrival times for 4 requests"):
        asyncio.run(
            run_against(
                FakeServer(),
                chat_requests,
                tmp_path / "requests.jsonl",
                concurrency=1,
                measured_requests=3,
                warmup_requests=1,
                arrivals=schedule,
            )
        )


def test_the_tables_and_the_charts_tell_a_rate_from_a_closed_loop():
    common = {"variant": "v", "workload": "w", "cpu_quota": 1, "requests": 8}
    arms = [
        common | {"name": "closed", "concurrency": 4},
        common | {"name": "bursty", "concurrency": 16, "request_rate": 8},
    ]
    arms[1]["burstiness"] = 0.25
    config = {"arms": arms}
    records = [{"arm": arm["name"], "run": 1, "valid": True} for arm in arms]
    loads = [
        "closed loop, 4 in flight",
        "8 req/s (burstiness 0.25), at most 16 in flight",
    ]
    runs = runs_table(records, config)
    assert runs["load"].tolist() == loads
    summary = arms_table(runs, config).drop_duplicates("arm")
    assert summary["load"].tolist() == loads
    labels = series_labels([Arm.from_config(arm) for arm in arms])
    assert labels == {
        "closed": "cpu, closed loop",
        "bursty": "cpu, 8 req/s (burstiness 0.25)",
    }
