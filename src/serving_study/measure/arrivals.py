"""When each request of an open loop arrives: a seeded schedule, drawn before the
clock starts.

An arm with a ``request_rate`` sends its requests at arrival times instead of
whenever a slot frees; client.py keeps at most the arm's ``concurrency`` in flight
either way. The gaps between arrivals follow a gamma distribution of shape
``burstiness`` and mean 1 / ``request_rate``: burstiness 1 is a Poisson process
(exponential gaps), and the gaps' coefficient of variation is 1 / sqrt(burstiness),
so below 1 the requests come in bursts and above 1 more evenly. The first request
arrives at 0 s.

The draws are seeded by the workload's seed and the run's block, in a stream of
their own (``workloads.ARRIVAL_STREAM``), so that every arm of a block sees the same
arrivals: arms of one burstiness see the same pattern, stretched to their rate, since
each gap is a standard gamma draw divided by rate x burstiness. Warm-up and measured
requests are one schedule, so the server is already at the rate when the measured
window opens. Each request's arrival is written to ``requests.jsonl`` (``arrival_s``)
and the schedule's settings to the client's summary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serving_study.config.records import Arm
from serving_study.workloads import ARRIVAL_STREAM


@dataclass(frozen=True)
class ArrivalSchedule:
    """Seconds from the run's start at which each request arrives, in order."""

    request_rate: float  # requests per second
    burstiness: float  # the gaps' gamma shape
    seed: int  # the workload's
    block: int  # the run block (the run's number)
    times_s: tuple[float, ...]

    @classmethod
    def drawn(
        cls,
        *,
        request_rate: float,
        burstiness: float,
        seed: int,
        block: int,
        count: int,
    ) -> ArrivalSchedule:
        """``count`` arrivals of the seeded process: 0, then cumulative gaps."""
        random = np.random.default_rng([seed, ARRIVAL_STREAM, block])
        gaps = random.standard_gamma(burstiness, size=max(count - 1, 0))
        times = np.concatenate(([0.0], np.cumsum(gaps / (request_rate * burstiness))))
        return cls(
            request_rate=request_rate,
            burstiness=burstiness,
            seed=seed,
            block=block,
            times_s=tuple(float(time) for time in times[:count]),
        )

    def record(self) -> dict:
        """What the run records of the schedule (its times go per request)."""
        return {
            "request_rate": self.request_rate,
            "burstiness": self.burstiness,
            "seed": self.seed,
            "stream": ARRIVAL_STREAM,
            "block": self.block,
            "arrivals": len(self.times_s),
            "last_arrival_s": round(self.times_s[-1], 6) if self.times_s else None,
        }


def arrival_schedule(
    arm: Arm, workload_manifest: Path, *, block: int, count: int
) -> ArrivalSchedule | None:
    """The arrivals of ``count`` requests of an arm's run in ``block`` on the
    workload of ``workload_manifest`` (its seed); None for a closed loop."""
    if arm.request_rate is None:
        return None
    manifest = json.loads(Path(workload_manifest).read_text(encoding="utf-8"))
    return ArrivalSchedule.drawn(
        request_rate=arm.request_rate,
        burstiness=arm.burstiness,
        seed=int(manifest["seed"]),
        block=block,
        count=count,
    )
