"""Remove a run's container when its runner dies without tearing it down.

    python -m serving_study.servers.container_watchdog RUNTIME CONTAINER

A container is the runtime's child, not the runner's, so it outlives a runner
killed outright. ``watch`` starts this process once the container runs, with
the parent-death signal set (``parent_death.told_of_parent_death``): it waits,
and when the runner dies the kernel sends it SIGTERM and it runs
``RUNTIME rm --force --volumes CONTAINER``. A runner that ends normally removes
the container itself and then stops the watchdog. Should the watchdog die with
the runner (a SLURM job kill ends every process of the job), the next preflight
or arm on the host removes the container by its owner label (``leftovers``).
"""

import signal
import subprocess
import sys

from serving_study.servers.parent_death import told_of_parent_death

REMOVE_TIMEOUT_S = 120


def watch(runtime: str, container: str) -> subprocess.Popen:
    """Start the watchdog of ``container`` (call it from the runner's main thread).

    Its own session keeps a Ctrl-C to the runner's process group away from it.
    """
    return subprocess.Popen(
        [sys.executable, "-m", __name__, runtime, container],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=told_of_parent_death,
        start_new_session=True,
    )


def stop(watchdog: subprocess.Popen) -> None:
    """Stop a watchdog whose container the runner removed itself."""
    if watchdog.poll() is None:
        watchdog.kill()
    watchdog.wait()


def main(arguments: list[str]) -> int:
    if len(arguments) != 2:
        print("usage: container_watchdog RUNTIME CONTAINER", file=sys.stderr)
        return 2
    runtime, container = arguments
    # SIGTERM is blocked since before exec, so one sent meanwhile waits here.
    signal.sigwait({signal.SIGTERM})
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return subprocess.run(
        [runtime, "rm", "--force", "--volumes", "--", container],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=REMOVE_TIMEOUT_S,
    ).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
