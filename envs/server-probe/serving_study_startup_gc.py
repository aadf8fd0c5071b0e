"""Start-up without Python's garbage collector, when the runner asks for it.

A real SGLang server's three processes each import SGLang, torch and transformers
before they serve. On a 2-core host that takes most of a server's 25-35 s start,
and a quarter of it is the collector scanning the young objects the imports make
(measured: 14.3 s with it, 10.9 s without, for the scheduler's imports alone).
Each arm starts a fresh server, so this is paid once per run.

With ``SERVING_STUDY_PAUSE_GC_AT_START=1`` the collector stays off from the first
line a process runs until the process first calls ``gc.freeze()``. SGLang's own
start-up calls it in every one of its processes right after its warm-up request,
before the server reports healthy. The real freeze then runs and the collector is
turned back on, so from then on each process collects exactly what it would have:
the objects made after the freeze. What the imports left behind is frozen with the
rest instead of collected first, because SGLang's freeze does not collect either,
and a collection of the ~800,000 objects a process holds by then takes it a second
on one core. Each process says so on stderr::

    serving-study gc resumed in pid <pid>

and the runner makes a run invalid when a process that loaded the module under
study never said it (for instance with ``--skip-server-warmup``, which skips the
freeze).
"""

import gc
import os
import sys

PAUSE_VARIABLE = "SERVING_STUDY_PAUSE_GC_AT_START"
RESUMED_LINE = "serving-study gc resumed in pid {pid}"


def pause_until_first_freeze() -> None:
    """Turn the collector off, and back on at this process's first ``gc.freeze()``."""
    if os.environ.get(PAUSE_VARIABLE) != "1" or not gc.isenabled():
        return
    real_freeze = gc.freeze

    def freeze_then_resume() -> None:
        gc.freeze = real_freeze
        real_freeze()
        gc.enable()
        print(RESUMED_LINE.format(pid=os.getpid()), file=sys.stderr, flush=True)

    gc.disable()
    gc.freeze = freeze_then_resume
