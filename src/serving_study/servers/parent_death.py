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

A process can also watch its own parent (``terminated_with_parent``): the arm
runner, whose parent is Snakemake, a program that sets no such signal for its jobs.
"""

import ctypes
import os
import select
import signal
import threading

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
    for it with ``signal.sigwait`` (a watchdog that must act, not just die); once
    per thread of a dying multithreaded parent, so it must ignore the rest."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    _signal_on_parent_death(signal.SIGTERM)


def terminated_with_parent() -> None:
    """SIGTERM to this process once its parent dies (Snakemake killed outright),
    so that its own SIGTERM handling tears down what it started. A daemon thread
    waits for the parent on a pidfd (Linux 5.3), or polls for it once a second."""
    parent = os.getppid()
    me = os.getpid()
    try:
        descriptor = os.pidfd_open(parent)
    except ProcessLookupError:
        os.kill(me, signal.SIGTERM)
        return
    except OSError:
        descriptor = None
    if os.getppid() != parent:  # it died before the watch began
        os.kill(me, signal.SIGTERM)
        return

    def wait_for_the_parent() -> None:
        if descriptor is not None:
            select.select([descriptor], [], [])
        else:
            while os.getppid() == parent:
                threading.Event().wait(1.0)
        os.kill(me, signal.SIGTERM)

    threading.Thread(
        target=wait_for_the_parent, name="parent-watch", daemon=True
    ).start()
