"""Where a run's wall time goes: the moments the runner passes, and the phases
between them.

The runner notes each moment as it passes it; the client's summary gives the
measured window's. The phases split the run into the server's own start (its launch
to its first healthy answer, polled every 50 ms: for a real server, SGLang's import,
model load and warm-up) and what the harness adds around the window, so that a
run's provenance says which of the two a slow start is.
"""

from __future__ import annotations

import time

PHASES = {
    "before_launch": ("lock_taken", "launched"),
    "server_start": ("launched", "healthy"),
    "after_healthy": ("healthy", "client_started"),
    "client_warmup": ("client_started", "measured_started"),
    "measured_window": ("measured_started", "measured_ended"),
    "after_window": ("measured_ended", "stop_started"),
    "server_stop": ("stop_started", "stopped"),
    "writing": ("stopped", "written"),
}


class RunTimeline:
    """The epoch of each moment a run has passed (the last, where one repeats)."""

    def __init__(self) -> None:
        self.moments: dict[str, float] = {}

    def note(self, moment: str) -> None:
        self.moments[moment] = time.time()

    def add_client(self, summary: dict) -> None:
        """The client's start and its measured window, from its summary."""
        start = summary["t0_epoch"]
        self.moments["client_started"] = start
        for moment, offset in (
            ("measured_started", summary.get("measured_start_s")),
            ("measured_ended", summary.get("measured_end_s")),
        ):
            if offset is not None:
                self.moments[moment] = start + offset

    def phases(self) -> dict[str, float | None]:
        """Seconds in each of PHASES; None where the run never reached its end."""
        return phases_between(self.moments, PHASES)


def phases_between(
    moments: dict[str, float | None], phases: dict[str, tuple[str, str]]
) -> dict[str, float | None]:
    """Seconds in each phase (name: its first and last moment), to the millisecond;
    None where either moment is missing."""
    return {
        name: (
            round(moments[end] - moments[start], 3)
            if moments.get(start) is not None and moments.get(end) is not None
            else None
        )
        for name, (start, end) in phases.items()
    }
