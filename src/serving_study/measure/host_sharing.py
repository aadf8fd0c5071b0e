"""How runs share a host: one measurement at a time, and a bound on other load.

Two pipelines on one host would measure each other. Every run therefore holds
the host's measurement lock (an ``flock`` on one file that every pipeline uses)
exclusively from before its server starts until it is torn down; a second
pipeline's run waits for it, or fails at once, as the config's
``host_sharing.lock`` says. Heavy preparation (bytecode compiles, workloads,
image and runtime builds, the preflight's probes) holds the same lock shared
(``preparation_lock``): preparations run beside each other, never beside a
measurement, so a second study prepares while the first is between runs and
the first's next run waits until it is done. The kernel drops the lock when its
holder dies, however it dies, so a killed runner never leaves the host locked.
An exclusive holder writes its record into the file (pid, what it runs, since
when), so a run that waits or fails can say for whom; shared holders write
none (several hold it at once) and are named as preparation jobs.

Work that takes no lock (anything else on the host) is caught afterwards: a run
whose measured window saw more than ``max_other_load_cores`` of other load is
invalid (``host_load`` measures it, ``run_validity`` gives the reason). The
settings are a ``HostSharing`` record (config/records.py).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import stat
import time
from pathlib import Path

from serving_study.config.records import HostSharing
from serving_study.measure.run_outputs import now_iso

log = logging.getLogger(__name__)

POLL_S = 0.2


class HostBusy(RuntimeError):
    """Another pipeline holds the host's lock; the message names it and the setting."""


class MeasurementLock:
    """The host's measurement lock, held from ``acquire`` until ``release``:
    exclusively by a measurement, shared by preparation (``preparation_lock``)."""

    def __init__(self, descriptor: int, path: Path, record: dict, shared: bool):
        self._descriptor: int | None = descriptor
        self.path = path
        self.record = record  # what provenance keeps: waited, and for whom
        self.shared = shared

    @classmethod
    def acquire(
        cls, sharing: HostSharing, holder: str, *, shared: bool = False
    ) -> MeasurementLock:
        """Take the lock, waiting as ``sharing`` allows; ``holder`` says what for.

        ``shared`` takes it for preparation: beside other shared holders, never
        beside an exclusive one. Raises HostBusy when the lock is held and the
        config says ``fail``, or after ``lock_wait_s`` of waiting.
        """
        path = sharing.lock_file
        descriptor = _open_lock_file(path)
        started = time.monotonic()
        held_by = None
        try:
            while not _try_lock(descriptor, shared):
                first_try = held_by is None
                held_by = held_by or _holder_of(descriptor, path)
                waited = time.monotonic() - started
                if sharing.lock == "fail" or waited > sharing.lock_wait_s:
                    raise HostBusy(
                        _busy_message(sharing, path, held_by, waited, holder)
                    )
                if first_try:
                    log.info(
                        "%s waits for the host's measurement lock %s, held by %s "
                        "(up to %g s: host_sharing.lock_wait_s)",
                        holder,
                        path,
                        held_by,
                        sharing.lock_wait_s,
                    )
                time.sleep(POLL_S)
            # A shared holder only clears the file: any record in it is a dead
            # exclusive holder's, as no exclusive holder can be alive now.
            os.ftruncate(descriptor, 0)
            if not shared:
                record = {"pid": os.getpid(), "holder": holder, "since": now_iso()}
                os.pwrite(descriptor, (json.dumps(record) + "\n").encode(), 0)
        except BaseException:
            os.close(descriptor)
            raise
        waited = round(time.monotonic() - started, 3)
        if held_by:
            log.info("measurement lock taken after %.1f s", waited)
        return cls(
            descriptor,
            path,
            {"lock_file": str(path), "waited_s": waited, "waited_for": held_by},
            shared,
        )

    def release(self) -> None:
        """Let the next measurement on this host begin; safe to repeat."""
        if self._descriptor is None:
            return
        try:
            if not self.shared:
                os.ftruncate(self._descriptor, 0)
        finally:
            os.close(self._descriptor)  # closing drops the flock
            self._descriptor = None

    def __enter__(self) -> MeasurementLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def preparation_lock(sharing: HostSharing, holder: str) -> MeasurementLock:
    """The lock held shared, for heavy preparation (``with preparation_lock(...)``):
    it waits while a measurement runs, and a measurement waits for it."""
    return MeasurementLock.acquire(sharing, holder, shared=True)


class UnsafeLockFile(OSError):
    """The lock file or its folder could be made or held by another user."""


def _owned_safely(status: os.stat_result) -> bool:
    """Owned by root or by this user, and writable by nobody else."""
    others_write = stat.S_IWGRP | stat.S_IWOTH
    return status.st_uid in (0, os.getuid()) and not status.st_mode & others_write


def _open_lock_file(path: Path) -> int:
    """The lock file, in a folder that only root (or this user) may write, owned by
    one of them: in a world-writable folder such as /run/lock itself, any local
    user could create the file first and hold the lock forever.

    Never through a symbolic link, and only a regular file: the holder's record
    is written into it.
    """
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not _owned_safely(path.parent.lstat()):
        raise UnsafeLockFile(
            errno.EPERM,
            f"{path.parent} may be written by another user, who could take the "
            "host's measurement lock; set host_sharing.lock_file to a file in a "
            "folder of its own (the default: /run/lock/serving-study/)",
        )
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    descriptor = os.open(path, flags, 0o644)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        if not _owned_safely(status):
            raise UnsafeLockFile(
                errno.EPERM,
                f"{path} belongs to another user or others may write it; remove "
                "it (the pipeline makes it anew)",
            )
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _try_lock(descriptor: int, shared: bool) -> bool:
    try:
        fcntl.flock(
            descriptor, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        )
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


def _holder_of(descriptor: int, path: Path) -> str:
    """Who holds the lock: the exclusive holder's record, else preparation jobs
    when it is held shared (they write none)."""
    try:
        record = json.loads(os.pread(descriptor, 4096, 0) or b"null")
    except ValueError:
        record = None
    if isinstance(record, dict):
        return (
            f"pid {record.get('pid')} ({record.get('holder')}, "
            f"since {record.get('since')})"
        )
    if _held_shared(path):
        return "preparation jobs (the lock is held shared; they leave no record)"
    return "an unnamed holder"


def _held_shared(path: Path) -> bool:
    """Whether a shared request would be granted now, on a descriptor of its own
    (a second flock on one descriptor would convert the first)."""
    descriptor = _open_lock_file(path)
    try:
        return _try_lock(descriptor, shared=True)
    finally:
        os.close(descriptor)


def _busy_message(
    sharing: HostSharing, path: Path, holder: str, waited: float, waiter: str
) -> str:
    if sharing.lock == "fail":
        return (
            f"another pipeline holds this host: {holder} holds {path}. "
            f"host_sharing.lock is 'fail', so {waiter} does not wait; run it when "
            "the other pipeline is done, or set host_sharing.lock: wait"
        )
    return (
        f"{waiter} waited {waited:.0f} s for this host's measurement lock {path}, "
        f"held by {holder}, longer than host_sharing.lock_wait_s "
        f"({sharing.lock_wait_s:g} s)"
    )
