"""Remove a run's container when its runner dies without tearing it down.

    python -m serving_study.servers.container_watchdog RUNTIME CONTAINER LOG

A container is the runtime's child, not the runner's, so it outlives a runner
killed outright. ``watch`` starts this process once the container runs, with
the parent-death signal set (``parent_death.told_of_parent_death``): it waits,
and when the runner dies the kernel sends it SIGTERM (again as each of the
runner's threads exits; those are ignored) and it runs
``RUNTIME rm --force --volumes CONTAINER`` until the container is gone, noting
each refusal in LOG (the run's server log). A runner that ends normally removes
the container itself and then stops the watchdog. Should the watchdog die with
the runner (a SLURM job kill ends every process of the job), the next preflight
or arm on the host removes the container by its owner label (``leftovers``).
"""

import signal
import subprocess
import sys
import time
from pathlib import Path

from serving_study.servers.parent_death import told_of_parent_death

REMOVE_TIMEOUT_S = 120
RETRY_EVERY_S = 1.0


def watch(runtime: str, container: str, log_path: Path) -> subprocess.Popen:
    """Start the watchdog of ``container`` (call it from the runner's main thread).

    Its own session keeps a Ctrl-C to the runner's process group away from it.
    """
    return subprocess.Popen(
        [sys.executable, "-m", __name__, runtime, container, str(log_path)],
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


def remove_until_gone(runtime: str, container: str, log_path: Path) -> int:
    """``rm --force`` the container, again while the runtime refuses (a daemon
    busy with the container's stop, a timeout), until it is gone or the time is
    up; 0 once it is gone."""
    deadline = time.monotonic() + REMOVE_TIMEOUT_S
    while True:
        left_s = max(1.0, deadline - time.monotonic())
        try:
            finished = subprocess.run(
                [runtime, "rm", "--force", "--volumes", "--", container],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=left_s,
            )
            refusal = finished.stderr.strip()
            if finished.returncode == 0 or "no such container" in refusal.lower():
                return 0
        except subprocess.TimeoutExpired:
            refusal = f"no answer in {left_s:.0f} s"
        with open(log_path, "a") as log:
            log.write(f"container watchdog: {runtime} rm {container}: {refusal}\n")
        if time.monotonic() + RETRY_EVERY_S >= deadline:
            return 1
        time.sleep(RETRY_EVERY_S)


def main(arguments: list[str]) -> int:
    if len(arguments) != 3:
        print("usage: container_watchdog RUNTIME CONTAINER LOG", file=sys.stderr)
        return 2
    runtime, container, log_path = arguments
    # SIGTERM is blocked since before exec, so one sent meanwhile waits here.
    signal.sigwait({signal.SIGTERM})
    # More follow: the kernel sends the parent-death signal again each time the
    # watchdog passes to another thread of the dying runner, as its threads exit
    # one after another. They must not cut the removal short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return remove_until_gone(runtime, container, Path(log_path))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
