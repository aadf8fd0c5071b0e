"""Children the kernel signals when their parent dies (``PR_SET_PDEATHSIG``).

A runner killed outright (SIGKILL, the OOM killer, ``timeout --kill-after``, a
SLURM job kill) runs no teardown, so what it started must end by itself. Each
function here is a ``preexec_fn`` for ``subprocess.Popen``: it runs in the child
between fork and exec, and the setting survives the exec (not a set-uid one).

Two facts make this safe to rely on. Popen returns only once the child has
exec'd, so the parent cannot die unnoticed between the fork and the ``prctl``.
And the kernel signals the child when the *thread* that forked it ends, so call
Popen from a thread that lives as long as the run (the runner's main thread).
The setting is not inherited by the child's own children: SGLang's and the
embedded engine's schedulers watch their parent themselves.
"""

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
# Loaded in the parent: the child between fork and exec only calls prctl.
_LIBC = ctypes.CDLL(None, use_errno=True)


def _signal_on_parent_death(signal_number: int) -> None:
    result = _LIBC.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal_number), 0, 0, 0)
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")


def killed_with_parent() -> None:
    """The child is SIGKILLed when its parent dies (a server)."""
    _signal_on_parent_death(signal.SIGKILL)


def told_of_parent_death() -> None:
    """The child gets SIGTERM when its parent dies, held pending until it waits
    for it with ``signal.sigwait`` (a watchdog that must act, not just die)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    _signal_on_parent_death(signal.SIGTERM)
