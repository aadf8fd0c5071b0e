"""A run's attempts: a re-measure never destroys a valid run, and a busy minute
costs a retry, not the run.

Snakemake deletes a job's outputs before it runs the job again, whatever made it
run again (``-f``, ``--forcerun``, an edited arm). So an attempt writes into a
folder of its own, outside Snakemake's outputs, and its files are copied to the
run's outputs once it has ended::

    results/<experiment>/attempts/<arm>/run<k>/<attempt>/   every attempt, kept
    results/<experiment>/attempts/<arm>/run<k>/current.json the one that is the run's

- An attempt in progress is ``<attempt>.partial``. The host's measurement lock is
  held from before the folder is made until the outputs are written, so the next
  attempt, which takes the lock first, finds only dead runners' partial folders and
  removes them: a killed run leaves nothing in a new one.
- An attempt that is invalid only for a reason outside the arm (the host's other
  load or steal, a server that never became healthy) is tried again, up to
  ``host_sharing.retries`` times, each time once the host has been quiet for
  ``quiet_for_s`` (host_load.py); a host that stays busy past ``quiet_wait_s``
  gets no more tries.
- The job's last attempt, valid, becomes the run's; the attempt it replaces is
  kept, superseded. Invalid only for a reason outside the arm, it gives the run
  back its earlier attempt, byte for byte, when that one was valid and measured
  the same settings; the failed attempt is kept beside it.
- Any other attempt becomes the run's, valid or not: its reasons are the arm's.

Every run's ``attempts.json`` lists its attempts with their outcome, the job that
made each and how long it waited for a quiet host, so the tables can show how many
tries a run took and why (the others never in a median).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from serving_study.config.records import HostSharing
from serving_study.measure.host_load import wait_for_quiet_host
from serving_study.measure.host_sharing import HostBusy, MeasurementLock
from serving_study.measure.run_failure import termination_as_interrupt
from serving_study.measure.run_outputs import RunPaths, write_json

log = logging.getLogger(__name__)

PARTIAL = ".partial"
CURRENT = "current.json"
LISTING = "attempts.json"
ATTEMPT_RECORD = "attempt.json"
# Outcomes an attempt can have, as attempts.json lists them.
CURRENT_OUTCOME = "current"
SUPERSEDED = "superseded"
FAILED_OUTSIDE_THE_ARM = "failed outside the arm"


@dataclass(frozen=True)
class Attempt:
    """One attempt at a run, in its own folder."""

    name: str
    directory: Path

    @property
    def paths(self) -> RunPaths:
        return RunPaths.in_directory(self.directory)


class RunAttempts:
    """The attempts of one (arm, run), and which of them is the run's outputs.

    ``settings_sha256`` identifies what the run measures (the arm, engine, client,
    monitors, variant and workload): an earlier attempt is given back only when
    it measured the same.
    """

    def __init__(
        self, root: Path, outputs: RunPaths, listing: Path, settings_sha256: str
    ):
        self.root = root
        self.outputs = outputs
        self.listing = listing  # the run's attempts.json, an output beside the rest
        self.settings_sha256 = settings_sha256
        # This job's attempts share it: the tables count a run's tries by it.
        self.job = f"{_stamp()}-{os.getpid()}"

    def begin(self) -> Attempt:
        """A fresh attempt folder; call it holding the host's measurement lock."""
        self.root.mkdir(parents=True, exist_ok=True)
        for dead in self.root.glob(f"*{PARTIAL}"):
            log.info("removing %s: its runner died before it ended", dead)
            shutil.rmtree(dead, ignore_errors=True)
        name = f"{_stamp()}-{os.getpid()}"
        directory = self.root / f"{name}{PARTIAL}"
        directory.mkdir()
        return Attempt(name, directory)

    def keep(self, attempt: Attempt, metrics: dict, waited_for_quiet_s: float) -> None:
        """Keep ``attempt``, measured (``metrics`` its metrics) after waiting
        ``waited_for_quiet_s`` for a quiet host."""
        kept = attempt.directory.with_name(attempt.name)
        attempt.directory.rename(kept)
        record = {
            "settings_sha256": self.settings_sha256,
            "valid": metrics["valid"],
            "outside_the_arm": failed_outside_the_arm(metrics),
            "job": self.job,
            "waited_for_quiet_s": waited_for_quiet_s,
        }
        write_json(kept / ATTEMPT_RECORD, record)

    def choose(self, attempt: Attempt, metrics: dict) -> dict:
        """Make the job's last kept ``attempt`` (``metrics`` its metrics), or the
        earlier valid one it gives back, the run's; return the run's metrics."""
        if failed_outside_the_arm(metrics):
            reasons = "; ".join(metrics.get("invalid_reasons") or [])
            why = f"attempt {attempt.name} failed outside the arm ({reasons})"
            if self.give_back_earlier(why):
                return json.loads(self.outputs.metrics.read_text())
        self._publish(attempt.name)
        return json.loads(self.outputs.metrics.read_text())

    def give_back_earlier(self, why: str) -> bool:
        """After an attempt that failed outside the arm, or measured nothing:
        write the earlier valid attempt of the same settings as the run's outputs
        again. False when there is none to give back."""
        earlier = self._current()
        if not self._can_give_back(earlier):
            return False
        log.warning("%s; the run keeps its earlier attempt %s", why, earlier["attempt"])
        self._publish(earlier["attempt"])
        return True

    def _current(self) -> dict | None:
        path = self.root / CURRENT
        return json.loads(path.read_text()) if path.exists() else None

    def _can_give_back(self, earlier: dict | None) -> bool:
        return bool(
            earlier
            and earlier["valid"]
            and earlier["settings_sha256"] == self.settings_sha256
            and (self.root / earlier["attempt"]).is_dir()
        )

    def _publish(self, name: str) -> None:
        """Copy attempt ``name``'s files to the run's outputs, name it the run's
        and list every attempt beside them."""
        source = RunPaths.in_directory(self.root / name)
        record = json.loads((self.root / name / ATTEMPT_RECORD).read_text())
        for field in RunPaths.__dataclass_fields__:
            target = getattr(self.outputs, field)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(getattr(source, field), target)
        write_json(self.root / CURRENT, {"attempt": name, **record})
        previous = self._listed()
        listing = []
        for attempt in sorted(p.name for p in self.root.iterdir() if p.is_dir()):
            if attempt.endswith(PARTIAL):
                continue
            kept = json.loads((self.root / attempt / ATTEMPT_RECORD).read_text())
            if attempt == name:
                outcome = CURRENT_OUTCOME
            elif kept.get("outside_the_arm") or (
                previous.get(attempt) == FAILED_OUTSIDE_THE_ARM
            ):
                outcome = FAILED_OUTSIDE_THE_ARM
            else:
                outcome = SUPERSEDED
            listing.append(self._describe(attempt, outcome, kept))
        write_json(self.root / LISTING, listing)
        shutil.copyfile(self.root / LISTING, self.listing)

    def _listed(self) -> dict[str, str]:
        """Each attempt's outcome as last listed (a failed one stays failed)."""
        path = self.root / LISTING
        listed = json.loads(path.read_text()) if path.exists() else []
        return {entry["attempt"]: entry["outcome"] for entry in listed}

    def _describe(self, attempt: str, outcome: str, kept: dict) -> dict:
        metrics = json.loads((self.root / attempt / "metrics.json").read_text())
        return {
            "attempt": attempt,
            "outcome": outcome,
            "valid": metrics.get("valid"),
            "throughput_rps": metrics.get("throughput_rps"),
            "invalid_reasons": metrics.get("invalid_reasons") or [],
            "job": kept.get("job"),
            "waited_for_quiet_s": kept.get("waited_for_quiet_s", 0),
        }


def failed_outside_the_arm(metrics: dict) -> bool:
    return not metrics["valid"] and bool(metrics.get("outside_the_arm"))


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


@termination_as_interrupt()
def measure_attempt(
    attempts: RunAttempts,
    sharing: HostSharing,
    holder: str,
    measure: Callable[[RunPaths, MeasurementLock], dict],
) -> dict:
    """A run's attempts: take the host's lock, measure into a fresh attempt
    folder (``measure`` writes the run's files into the paths it is given, under
    the lock it is given), try again after a quiet host as ``sharing`` allows
    while an attempt fails outside the arm, then choose and write the run's
    outputs; return the run's metrics. A host whose lock stays busy gives back
    the earlier valid attempt of the same settings, or raises HostBusy when
    there is none."""
    try:
        lock = MeasurementLock.acquire(sharing, holder)
    except HostBusy as busy:
        if attempts.give_back_earlier(f"this attempt measured nothing: {busy}"):
            return json.loads(attempts.outputs.metrics.read_text())
        raise
    with lock:
        waited = 0.0
        for tries_left in range(sharing.retries, -1, -1):
            attempt = attempts.begin()
            metrics = measure(attempt.paths, lock)
            attempts.keep(attempt, metrics, waited)
            if not failed_outside_the_arm(metrics) or not tries_left:
                break
            log.warning(
                "attempt %s failed outside the arm (%s); %d more tries, each after "
                "the host has been quiet for %g s",
                attempt.name,
                "; ".join(metrics.get("invalid_reasons") or []),
                tries_left,
                sharing.quiet_for_s,
            )
            quiet = wait_for_quiet_host(sharing)
            waited = quiet["waited_s"]
            if not quiet["quiet"]:
                log.warning(
                    "the host stayed busy for %g s (host_sharing.quiet_wait_s; "
                    "the last %g s saw %s): no more tries",
                    waited,
                    sharing.quiet_for_s,
                    quiet["last_window"],
                )
                break
        return attempts.choose(attempt, metrics)
