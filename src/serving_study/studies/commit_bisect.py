"""Binary search between two commits for the one that changed a figure.

Given a git repository, an older commit ``good`` (before the change) and a newer
commit ``bad`` (after it), the search walks the first-parent history from good to
bad. Each probe fetches its commit's source (``sources.fetch_source``, a git
record), lays it out as an unpatched variant, and measures it with
``arm_runner.run_arm``: ``runs`` runs of one arm's settings. The two ends are
measured first; they must differ by the change criterion (release_change.py),
or there is nothing to find.

Each probe runs in a block with fresh runs of both ends, in a seeded shuffled
order, and is compared with the ends of its own block by the same criterion, so
drift of the host between probes cannot move a probe to the wrong side:

- like good and unlike bad: the change came later, the probe is good;
- unlike good and like bad: the change came at or before it, the probe is bad;
- like both, unlike both, ends of its block that do not differ, or too few valid
  runs anywhere: the probe is undecided. A busy minute on the host can stretch one
  run across the other side's range, so an undecided probe is measured again in a
  fresh block, up to ``repeats`` times; if it stays undecided (or its commit cannot
  be loaded at all) the search stops, and the result names the commits it could
  not narrow down.

It ends when a good and a bad probe are neighbours: the bad one is the first
commit that changed the figure, and "found" means that each neighbour met the
criterion on its own side. Every measurement is recorded in the result, with a
bound on the chance that any comparison fell apart by chance alone; the Snakemake
rule writes it as ``results/<experiment>/bisect.json``.

With first-parent history a change that arrived in a merge is found as that merge
commit (SGLang squash-merges its pull requests, so there each commit is one).
"""

import json
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from serving_study.analysis.release_change import (
    CANNOT_TELL,
    ChangeCriterion,
    Comparison,
    Spread,
    any_false_alarm_bound,
    compare,
    false_alarm_chance,
)
from serving_study.analysis.summaries import arms_table, runs_table
from serving_study.config.records import (
    Arm,
    ClientSettings,
    HostSharing,
    MonitorSettings,
    ServerSettings,
    Variant,
)
from serving_study.engine.shm_loader import VariantSourceError, load_variant_transport
from serving_study.launch.engines import launch_plan
from serving_study.measure.arm_runner import run_arm
from serving_study.measure.run_outputs import RunPaths
from serving_study.sources.fetch import fetch_source
from serving_study.sources.variants import prepare_variant
from serving_study.studies.commit_history import BisectError, first_parent_commits

log = logging.getLogger(__name__)

GOOD = "good"
BAD = "bad"

FOUND = "found"
ENDS_ALIKE = "ends do not differ"
INCONCLUSIVE = "inconclusive"

# The key of a Measurement's details that says its commit could not be loaded:
# measuring it again would tell nothing new.
UNMEASURABLE = "unmeasurable"


@dataclass(frozen=True)
class Probe:
    """One measured commit and where it fell."""

    commit: str
    role: str
    spread: Spread
    side: str | None = None
    against_good: Comparison | None = None
    against_bad: Comparison | None = None
    reason: str = ""
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "commit": self.commit,
            "role": self.role,
            **self.spread.as_dict(),
            "side": self.side,
            "against_good": self.against_good.as_dict() if self.against_good else None,
            "against_bad": self.against_bad.as_dict() if self.against_bad else None,
            "reason": self.reason,
            **self.details,
        }


@dataclass(frozen=True)
class Measurement:
    """What measuring one commit gave: its spread and anything worth recording."""

    spread: Spread
    details: dict = field(default_factory=dict)


def classify(
    probe: Spread, good: Spread, bad: Spread, criterion: ChangeCriterion
) -> tuple[str | None, Comparison, Comparison, str]:
    """Which end a probe is like, against the ends measured in its block:
    (side, or None when undecided; vs good; vs bad; why)."""
    against_good = compare(good, probe, criterion)
    against_bad = compare(bad, probe, criterion)
    if CANNOT_TELL in (against_good.verdict, against_bad.verdict):
        return None, against_good, against_bad, "too few valid runs to compare"
    if not compare(good, bad, criterion).changed:
        return None, against_good, against_bad, "the ends of its block do not differ"
    if against_good.changed and not against_bad.changed:
        return BAD, against_good, against_bad, "unlike good, like bad"
    if against_bad.changed and not against_good.changed:
        return GOOD, against_good, against_bad, "like good, unlike bad"
    how = "unlike both ends" if against_good.changed else "like both ends"
    return None, against_good, against_bad, f"{how}: undecided"


def block_order(seed: int, block: int) -> list[str]:
    """The order of the good end, the probe and the bad end in one block."""
    roles = [GOOD, "probe", BAD]
    random.Random(f"{seed}-bisect-block-{block}").shuffle(roles)
    return roles


def search(
    commits: Sequence[str],
    measure: Callable[[str, str, int], Measurement],
    criterion: ChangeCriterion,
    seed: int = 0,
    repeats: int = 0,
) -> dict:
    """Bisect ``commits`` (oldest, the good end, first; the bad end last).

    ``measure(commit, role, block)`` runs one commit and returns its Measurement.
    An undecided probe gets up to ``repeats`` more blocks. Returns the result:
    status, the first bad commit when found, and every measurement.
    """
    if len(commits) < 2:
        raise BisectError("a bisect needs two different commits, good and bad")
    probes: list[Probe] = []

    def measured(commit: str, role: str, block: int) -> Spread:
        measurement = measure(commit, role, block)
        details = {**measurement.details, "block": block}
        probes.append(Probe(commit, role, measurement.spread, details=details))
        return measurement.spread

    good = measured(commits[0], "good end", 0)
    bad = measured(commits[-1], "bad end", 0)
    ends = compare(good, bad, criterion)
    low, high = 0, len(commits) - 1
    status, reason = FOUND, ""
    if not ends.changed:
        status, reason = ENDS_ALIKE, f"good and bad: {ends.verdict} ({ends.detail})"
    block = repeated = 0
    while status == FOUND and high - low > 1:
        block += 1
        middle = (low + high) // 2
        members = {
            GOOD: (commits[0], "good end"),
            "probe": (commits[middle], "probe"),
            BAD: (commits[-1], "bad end"),
        }
        spreads, places = {}, {}
        for role in block_order(seed, block):
            spreads[role] = measured(*members[role], block)
            places[role] = len(probes) - 1
        side, against_good, against_bad, why = classify(
            spreads["probe"], spreads[GOOD], spreads[BAD], criterion
        )
        probe_index = places["probe"]
        probes[probe_index] = replace(
            probes[probe_index],
            side=side,
            against_good=against_good,
            against_bad=against_bad,
            reason=why,
        )
        log.info("commit %s: %s (%s)", commits[middle], side or "undecided", why)
        if side == GOOD:
            low, repeated = middle, 0
        elif side == BAD:
            high, repeated = middle, 0
        elif repeated < repeats and UNMEASURABLE not in probes[probe_index].details:
            repeated += 1
            log.info(
                "commit %s: measuring its block again (%d of %d)",
                commits[middle],
                repeated,
                repeats,
            )
        else:
            status = INCONCLUSIVE
            reason = (
                f"commit {commits[middle]} is undecided ({why}); the change "
                f"lies between {commits[low]} and {commits[high]}"
            )
    if status == FOUND:
        reason = (
            f"{commits[high]} is the first commit whose {criterion.metric} is like "
            f"the bad end's and unlike the good end's; {commits[low]} before it is "
            "like the good end's and unlike the bad end's"
        )
    return {
        "criterion": {
            "metric": criterion.metric,
            "min_change": criterion.min_change,
            "min_valid_runs": criterion.min_valid_runs,
            "false_alarm_chance": false_alarm_chance(
                criterion.min_valid_runs, criterion.min_valid_runs
            ),
        },
        "commits_in_range": len(commits),
        "ends": ends.as_dict(),
        "status": status,
        "reason": reason,
        "last_good_commit": None if status == ENDS_ALIKE else commits[low],
        "first_bad_commit": commits[high] if status == FOUND else None,
        **error_rate(block, criterion),
        "probes": [probe.as_dict() for probe in probes],
    }


def error_rate(blocks: int, criterion: ChangeCriterion) -> dict:
    """How many comparisons the search made (the ends once, then in each block the
    ends and the probe against each end), and at most how often any of them would
    fall apart by chance alone had nothing changed (each one's chance: the
    criterion's ranges, ``min_valid_runs`` against as many)."""
    comparisons = 1 + 3 * blocks
    each = false_alarm_chance(criterion.min_valid_runs, criterion.min_valid_runs)
    bound = any_false_alarm_bound([each] * comparisons)
    return {"comparisons": comparisons, "false_alarm_bound": bound}


# --- one probe: fetch, variant, runs ------------------------------------------------


@dataclass(frozen=True)
class ProbeSettings:
    """Everything a probe's runs need besides the commit."""

    experiment: str
    repository: str
    arm: Arm
    runs: int
    workload_manifest: Path
    server_settings: ServerSettings
    client: ClientSettings
    monitors: MonitorSettings
    sharing: HostSharing
    criterion: ChangeCriterion
    sources_dir: Path
    probes_dir: Path
    repeats: int
    seed: int = 0


def commit_variant(commit: str, settings: ProbeSettings) -> Variant:
    """Fetch ``commit`` and lay it out as an unpatched variant, once per commit."""
    name = f"commit-{commit[:12]}"
    commit_dir = settings.probes_dir / commit[:12]
    identity_file = commit_dir / "variant.json"
    if identity_file.is_file():
        return Variant.from_identity(json.loads(identity_file.read_text()))
    commit_dir.mkdir(parents=True, exist_ok=True)
    record = {"name": name, "git": {"url": settings.repository, "commit": commit}}
    # Absolute: fetch_source runs git in a directory of its own.
    source_tree = settings.sources_dir.resolve() / commit
    source_identity = fetch_source(record, source_tree)
    identity = prepare_variant(
        {"name": name, "source": name},
        source_tree=source_tree,
        source_identity=source_identity,
        patch_path=None,
        dest=commit_dir / "variant",
    )
    identity_file.write_text(json.dumps(identity, indent=2) + "\n")
    return Variant.from_identity(identity)


def measure_commit(
    commit: str, role: str, block: int, settings: ProbeSettings
) -> Measurement:
    """Run the arm ``runs`` times on ``commit``'s variant, within ``block``."""
    variant = commit_variant(commit, settings)
    commit_dir = settings.probes_dir / commit[:12]
    probe_dir = commit_dir / f"block{block}"
    probe_dir.mkdir(parents=True, exist_ok=True)
    details = {"variant": str(commit_dir / "variant.json"), "runs_dir": str(probe_dir)}
    try:
        load_variant_transport(Path(variant.sglang_python_root))
    except VariantSourceError as error:
        log.error("commit %s cannot be loaded: %s", commit, error)
        return Measurement(Spread.of_values([]), {**details, UNMEASURABLE: str(error)})

    arm = replace(settings.arm, name=variant.name, variant=variant.name)
    records = []
    for run in range(1, settings.runs + 1):
        run_dir = probe_dir / f"run{run}"
        run_dir.mkdir(exist_ok=True)
        log.info("%s %s: run %d of %d", role, commit, run, settings.runs)
        records.append(
            run_arm(
                experiment=settings.experiment,
                arm=arm,
                run=run,
                variant=variant,
                workload_manifest=settings.workload_manifest,
                plan=launch_plan(
                    settings.server_settings, arm, variant, settings.workload_manifest
                ),
                client=settings.client,
                monitors=settings.monitors,
                sharing=settings.sharing,
                paths=RunPaths.in_directory(run_dir),
            )
        )
    probe_config = {"arms": [arm.as_config()]}
    arms = arms_table(runs_table(records, probe_config), probe_config)
    spread = Spread.of_arm(arms, arm.name, settings.criterion.metric)
    invalid = [
        f"run{record['run']}: {'; '.join(record.get('invalid_reasons') or [])}"
        for record in records
        if not record.get("valid")
    ]
    return Measurement(spread, {**details, "invalid_runs": invalid})


def run_commit_bisect(good: str, bad: str, settings: ProbeSettings) -> dict:
    """The whole bisect: list the commits, search, return the result to record."""
    started = datetime.now(UTC).isoformat(timespec="seconds")
    commits = first_parent_commits(settings.repository, good, bad)
    log.info(
        "bisect %s..%s: %d commits, about %d probes, each beside both ends",
        commits[0],
        commits[-1],
        len(commits),
        math.ceil(math.log2(max(len(commits) - 1, 1))),
    )
    result = search(
        commits,
        lambda commit, role, block: measure_commit(commit, role, block, settings),
        settings.criterion,
        seed=settings.seed,
        repeats=settings.repeats,
    )
    return {
        "experiment": settings.experiment,
        "repository": settings.repository,
        "good": {"revision": good, "commit": commits[0]},
        "bad": {"revision": bad, "commit": commits[-1]},
        "arm": settings.arm.as_config(),
        "runs_per_probe": settings.runs,
        "repeats_when_undecided": settings.repeats,
        **result,
        "started_at": started,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
