"""How a run ends early: a recorded failure, or an interrupt that still tears down.

A run that cannot be measured raises `ArmFailed`, and the study goes on.
"""

import contextlib
import signal
import traceback


class ArmFailed(RuntimeError):
    """The run could not be measured; the message is recorded as its reason."""


class FailedOutsideTheArm(ArmFailed):
    """The run could not be measured for a reason that is not the arm's (its
    server never became healthy, though the same settings served before)."""


def failure_reason(failure: Exception, provenance: dict) -> str:
    """The reason a run that raised ``failure`` records: ArmFailed's message, or
    any other exception's type and message, its traceback kept in ``provenance``
    (call it from the ``except`` clause)."""
    if isinstance(failure, ArmFailed):
        return str(failure)
    provenance["traceback"] = traceback.format_exc()
    return f"unexpected {type(failure).__name__}: {failure}"


@contextlib.contextmanager
def termination_as_interrupt():
    """Turn SIGTERM into KeyboardInterrupt while a run is in progress.

    Snakemake stops running jobs with SIGTERM when it is interrupted; Python's
    default would end the process at once, skipping every ``finally`` and leaving
    the server, its cgroup and its segments behind. As an exception, the teardown
    runs and the job ends without writing outputs, so a rerun (with
    --rerun-incomplete) measures the run afresh.
    """

    def interrupt(signal_number, frame):
        raise KeyboardInterrupt(f"stopped by signal {signal_number}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
