"""The progress line of a run: requests done of total, req/s so far, elapsed.

tqdm draws it, on the terminal the user watches and nowhere else. That is the
client's stderr when it is a terminal; under Snakemake a run's stderr is its log
file (scripts/run_arm.py), but its stdout is Snakemake's own, the user's terminal
when Snakemake runs in one. A stream counts only while this process's group is
the terminal's foreground group: a study sent to the background, or started in a
session of its own, draws nothing (and is never stopped for writing to a terminal
it does not own). Nothing is drawn where the environment sets ``CI``, or where no
stream is a terminal (a pipe, a file, a cluster job's log), so no log gets the
line's carriage returns. The line is cleared when the run ends.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from tqdm import tqdm

# Cut to the terminal's width from the end: what matters most comes first.
# A terminal that reports no size (a new pseudo-terminal, some containers'), on
# which tqdm would draw nothing, is taken to be this size.
FALLBACK_SIZE = os.terminal_size((80, 24))
LINE = "{desc} {n_fmt}/{total_fmt} done, {rate_fmt} so far, {elapsed} elapsed{postfix}"


def progress_terminal() -> TextIO | None:
    """Where the progress line goes: stderr or else stdout, the first that is a
    terminal in this process's foreground; None in CI or where neither is."""
    if os.environ.get("CI"):
        return None
    for stream in (sys.stderr, sys.stdout):
        if _in_foreground(stream):
            return stream
    return None


def _in_foreground(stream: TextIO | None) -> bool:
    try:
        descriptor = stream.fileno()
        return os.isatty(descriptor) and os.tcgetpgrp(descriptor) == os.getpgrp()
    except (AttributeError, OSError, ValueError):  # no file, or not our terminal
        return False


class ProgressLine:
    """One run's line on ``terminal`` (None: drawn nowhere)."""

    def __init__(self, total: int, warmup: int, terminal: TextIO | None):
        self.warmup = warmup
        size = os.get_terminal_size(terminal.fileno()) if terminal else FALLBACK_SIZE
        sized = min(size) > 0
        self.bar = tqdm(
            total=total,
            desc=self._phase(0),
            unit=" req",
            bar_format=LINE,
            file=terminal,
            disable=terminal is None,
            leave=False,
            dynamic_ncols=sized,
            ncols=None if sized else FALLBACK_SIZE.columns,
            nrows=None if sized else FALLBACK_SIZE.lines,
        )

    def show(self, done: int, errors: int, in_flight: int) -> None:
        """Redraw with these counts; the rate is done over the elapsed time."""
        self.bar.n = done
        self.bar.set_description_str(self._phase(done), refresh=False)
        self.bar.set_postfix_str(f"{errors} errors, {in_flight} in flight", False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()

    def _phase(self, done: int) -> str:
        return "warm-up" if done < self.warmup else "measured"
