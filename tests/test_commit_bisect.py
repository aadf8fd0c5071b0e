"""The commit bisect: history listing, the search, its config, and one real bisect.

The repositories here are small local git repositories made by the tests, whose
``python/sglang`` holds the two files the embedded engine runs, taken from the
real SGLang 0.5.23 source: ``mm_utils.py`` (with PR #48881's numpy copy or the
released torch ``copy_()``) and ``stale_shm_cleanup.py``.

The search tests give ``search`` measurements made up per commit, so each
outcome (found, ends alike, a probe that cannot be placed, a probe between the
ends) is exercised exactly; the last test runs a real bisect through Snakemake.
"""

import json
import math
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
import yaml
from study_helpers import leaked_segments, snakemake_command

from serving_study.analysis.release_change import ChangeCriterion, Spread
from serving_study.config.validation import ConfigError, check_config
from serving_study.studies.commit_bisect import (
    BAD,
    ENDS_ALIKE,
    FOUND,
    GOOD,
    INCONCLUSIVE,
    UNMEASURABLE,
    Measurement,
    block_order,
    search,
)
from serving_study.studies.commit_history import BisectError, first_parent_commits

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema" / "config.schema.yaml"

MM_UTILS = Path("python/sglang/srt/managers/mm_utils.py")
STALE_SHM_CLEANUP = Path("python/sglang/srt/utils/stale_shm_cleanup.py")
TORCH_COPY = """\
            dst = torch.frombuffer(shm.buf, dtype=torch.uint8)
            dst.copy_(tensor.view(torch.uint8).reshape(-1))
"""
NUMPY_COPY = """\
            shm.buf[:] = tensor.detach().view(torch.uint8).reshape(-1).numpy()
"""


def git(repository: Path, *arguments: str) -> str:
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith("GIT_")
    }
    environment.update(
        GIT_AUTHOR_NAME="test",
        GIT_AUTHOR_EMAIL="test@example.org",
        GIT_COMMITTER_NAME="test",
        GIT_COMMITTER_EMAIL="test@example.org",
    )
    return subprocess.run(
        ["git", *arguments],
        cwd=repository,
        check=True,
        capture_output=True,
        text=True,
        env=environment,
    ).stdout.strip()


def commit_all(repository: Path, message: str) -> str:
    git(repository, "add", "--all")
    git(repository, "commit", "--quiet", "--message", message)
    return git(repository, "rev-parse", "HEAD")


def make_repository(
    directory: Path, sglang_tree: Path, switch_at: int, commits: int
) -> list[str]:
    """Commits 0..commits-1 of a repository; commit ``switch_at`` swaps the
    numpy copy for torch's copy_(), every other commit edits only a README.
    Commit 0 is tagged ``before-copy``; returns the commits, oldest first."""
    released = (sglang_tree / MM_UTILS).read_text()
    assert released.count(TORCH_COPY) == 1
    (directory / MM_UTILS).parent.mkdir(parents=True)
    (directory / STALE_SHM_CLEANUP).parent.mkdir(parents=True)
    git(directory, "init", "--quiet")
    (directory / MM_UTILS).write_text(released.replace(TORCH_COPY, NUMPY_COPY))
    shutil.copyfile(sglang_tree / STALE_SHM_CLEANUP, directory / STALE_SHM_CLEANUP)
    (directory / "README").write_text("commit 0\n")
    shas = [commit_all(directory, "numpy copy into shared memory (PR #48881)")]
    git(directory, "tag", "before-copy")
    for index in range(1, commits):
        if index == switch_at:
            (directory / MM_UTILS).write_text(released)
            message = "copy into shared memory with torch copy_()"
        else:
            (directory / "README").write_text(f"commit {index}\n")
            message = f"unrelated change {index}"
        shas.append(commit_all(directory, message))
    return shas


@pytest.fixture
def repository(tmp_path, sglang_0_5_23) -> tuple[Path, list[str]]:
    tree, _ = sglang_0_5_23
    directory = tmp_path / "sglang"
    directory.mkdir()
    return directory, make_repository(directory, tree, switch_at=3, commits=5)


# --- history ----------------------------------------------------------------------


def test_commits_run_from_good_to_bad_and_tags_resolve(repository):
    directory, shas = repository
    assert first_parent_commits(str(directory), "before-copy", shas[-1]) == shas
    assert first_parent_commits(str(directory), shas[1][:10], shas[3]) == shas[1:4]


def test_a_good_end_off_the_bad_ends_history_is_refused(repository):
    directory, shas = repository
    git(directory, "checkout", "--quiet", "-b", "side", shas[1])
    (directory / "README").write_text("on a side branch\n")
    side = commit_all(directory, "side branch")
    with pytest.raises(BisectError, match="is not an ancestor of bad"):
        first_parent_commits(str(directory), side, shas[-1])


def test_an_unknown_revision_is_refused(repository):
    directory, shas = repository
    with pytest.raises(BisectError, match="bisect.good: 'v9.9' is neither"):
        first_parent_commits(str(directory), "v9.9", shas[-1])


def test_a_repository_that_looks_like_an_option_is_only_a_repository(tmp_path):
    marker = tmp_path / "upload-pack-ran"
    repository = f"--upload-pack=touch {marker}"
    # Read as an option, git would clone the temporary directory instead.
    with pytest.raises(BisectError, match=f"repository '{repository}' does not exist"):
        first_parent_commits(repository, "v1", "v2")
    assert not marker.exists()


def test_a_revision_that_looks_like_an_option_is_refused(repository):
    directory, shas = repository
    with pytest.raises(BisectError, match="bisect.good: '--all' starts with '-'"):
        first_parent_commits(str(directory), "--all", shas[-1])


# --- the search, with made-up measurements -------------------------------------------

FAST = Spread(20.0, 19.5, 20.5, 3)
SLOW = Spread(10.0, 9.5, 10.5, 3)


def measurements(spreads: dict[str, Spread]):
    measured = []

    def measure(commit: str, role: str, block: int) -> Measurement:
        measured.append((commit, role))
        return Measurement(spreads[commit], {"note": f"measured {commit}"})

    return measure, measured


@pytest.mark.parametrize("switch_at", range(1, 9))
def test_search_finds_the_commit_wherever_it_is(switch_at):
    commits = [f"c{index}" for index in range(9)]
    spreads = {
        commit: FAST if index < switch_at else SLOW
        for index, commit in enumerate(commits)
    }
    measure, measured = measurements(spreads)

    result = search(commits, measure, ChangeCriterion())

    assert result["status"] == FOUND
    assert result["first_bad_commit"] == f"c{switch_at}"
    assert result["last_good_commit"] == f"c{switch_at - 1}"
    assert measured[:2] == [("c0", "good end"), ("c8", "bad end")]
    steps = math.ceil(math.log2(len(commits) - 1))
    assert len(measured) <= 2 + 3 * steps
    probes = result["probes"]
    assert [probe["commit"] for probe in probes] == [commit for commit, _ in measured]
    # Every probe ran in a block beside fresh runs of both ends.
    for block in range(1, max(p["block"] for p in probes) + 1):
        roles = sorted(p["role"] for p in probes if p["block"] == block)
        assert roles == ["bad end", "good end", "probe"]
    for probe in (p for p in probes if p["role"] == "probe"):
        index = int(probe["commit"][1:])
        assert probe["side"] == (GOOD if index < switch_at else BAD)
        assert probe["note"] == f"measured {probe['commit']}"
        assert probe["against_good"]["verdict"] and probe["against_bad"]["verdict"]
    # One comparison of the ends, then three per block; each may fall apart by
    # chance in 10% of cases with 3 runs against 3, and the bound sums them.
    blocks = max(p["block"] for p in probes)
    assert result["comparisons"] == 1 + 3 * blocks
    assert result["false_alarm_bound"] == pytest.approx(min(1, 0.1 * (1 + 3 * blocks)))


def test_each_probe_is_judged_against_the_ends_of_its_own_block():
    """A host that slows by 40% from block to block: against the ends measured
    first, a fast commit in block 2 would look slower than the slow end. Beside
    the ends of its own block it is plainly like the good one."""
    commits = [f"c{index}" for index in range(9)]
    switch_at = 3
    blocks_seen = []

    def measure(commit: str, role: str, block: int) -> Measurement:
        blocks_seen.append(block)
        base = FAST if int(commit[1:]) < switch_at else SLOW
        drift = 0.6**block
        return Measurement(
            Spread(base.median * drift, base.low * drift, base.high * drift, base.runs)
        )

    result = search(commits, measure, ChangeCriterion())
    assert result["status"] == FOUND
    assert result["first_bad_commit"] == "c3"
    assert max(blocks_seen) >= 2


def test_block_orders_are_seeded_and_shuffled():
    orders = [tuple(block_order(7, block)) for block in range(1, 9)]
    assert all(sorted(order) == sorted([GOOD, "probe", BAD]) for order in orders)
    assert len(set(orders)) > 1
    assert orders == [tuple(block_order(7, block)) for block in range(1, 9)]


def test_ends_that_do_not_differ_stop_the_search():
    commits = ["c0", "c1", "c2"]
    measure, measured = measurements(
        {"c0": FAST, "c1": SLOW, "c2": Spread(20.2, 19.8, 20.6, 3)}
    )
    result = search(commits, measure, ChangeCriterion())
    assert result["status"] == ENDS_ALIKE
    assert result["first_bad_commit"] is None
    assert [commit for commit, _ in measured] == ["c0", "c2"]
    assert result["comparisons"] == 1


def test_a_probe_without_enough_valid_runs_leaves_the_range_open():
    commits = [f"c{index}" for index in range(5)]
    broken = Spread(math.nan, math.nan, math.nan, 0)
    spreads = {"c0": FAST, "c1": FAST, "c2": broken, "c3": SLOW, "c4": SLOW}
    measure, _ = measurements(spreads)
    result = search(commits, measure, ChangeCriterion())
    assert result["status"] == INCONCLUSIVE
    assert result["first_bad_commit"] is None
    assert "between c0 and c4" in result["reason"]
    probe = next(p for p in result["probes"] if p["role"] == "probe")
    assert probe["side"] is None


@pytest.mark.parametrize(
    ("probe", "why"),
    [
        (Spread(12.0, 11.8, 12.2, 3), "unlike both ends: undecided"),
        (Spread(15.0, 9.0, 21.0, 3), "like both ends: undecided"),
    ],
)
def test_a_probe_that_matches_neither_end_or_both_is_undecided(probe, why):
    commits = ["c0", "c1", "c2"]
    measure, _ = measurements({"c0": FAST, "c1": probe, "c2": SLOW})
    result = search(commits, measure, ChangeCriterion())
    assert result["status"] == INCONCLUSIVE
    assert result["first_bad_commit"] is None
    probe_record = next(p for p in result["probes"] if p["role"] == "probe")
    assert probe_record["side"] is None
    assert probe_record["reason"] == why
    assert "c1 is undecided" in result["reason"]


def test_an_undecided_probe_is_measured_again_in_a_fresh_block():
    """One busy minute stretches the probe's range over both ends in its first
    block; measured again beside fresh ends it falls plainly on the bad side, and
    the second block's comparisons count in the bound."""
    commits = ["c0", "c1", "c2"]
    disturbed = Spread(15.0, 9.0, 21.0, 3)

    def measure(commit: str, role: str, block: int) -> Measurement:
        if commit == "c1":
            return Measurement(disturbed if block == 1 else SLOW)
        return Measurement(FAST if commit == "c0" else SLOW)

    result = search(commits, measure, ChangeCriterion(), repeats=1)
    assert result["status"] == FOUND
    assert result["first_bad_commit"] == "c1"
    probes = [p for p in result["probes"] if p["role"] == "probe"]
    assert [(p["block"], p["side"]) for p in probes] == [(1, None), (2, BAD)]
    assert probes[0]["reason"] == "like both ends: undecided"
    assert result["comparisons"] == 1 + 3 * 2


def test_a_probe_undecided_in_every_block_stops_after_its_repeats():
    commits = ["c0", "c1", "c2"]
    measure, measured = measurements(
        {"c0": FAST, "c1": Spread(15.0, 9.0, 21.0, 3), "c2": SLOW}
    )
    result = search(commits, measure, ChangeCriterion(), repeats=2)
    assert result["status"] == INCONCLUSIVE
    assert [commit for commit, _ in measured].count("c1") == 3
    assert result["comparisons"] == 1 + 3 * 3


def test_a_commit_that_cannot_be_loaded_is_not_measured_again():
    commits = ["c0", "c1", "c2"]
    measured = []

    def measure(commit: str, role: str, block: int) -> Measurement:
        measured.append(commit)
        if commit == "c1":
            unmeasured = Spread(math.nan, math.nan, math.nan, 0)
            return Measurement(unmeasured, {UNMEASURABLE: "no ShmPointerMMData"})
        return Measurement(FAST if commit == "c0" else SLOW)

    result = search(commits, measure, ChangeCriterion(), repeats=3)
    assert result["status"] == INCONCLUSIVE
    assert measured.count("c1") == 1


# --- config ------------------------------------------------------------------------


def bisect_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "bisect.yaml").read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"arm": "0.5.99"},
            "bisect.arm: '0.5.99' names no arm",
        ),
        (
            {"good": "v0.5.10"},
            "bisect: good and bad are the same revision",
        ),
        (
            {"bad": "--upload-pack=touch /tmp/x"},
            "bisect.bad: '--upload-pack=touch /tmp/x' does not match",
        ),
        ({"runs": 0}, "bisect.runs: 0 is less than the minimum of 1"),
        ({"repeats": 4}, "bisect.repeats: 4 is greater than the maximum of 3"),
        ({"repo": "x"}, "bisect: unknown key 'repo'"),
    ],
)
def test_bad_bisect_settings_are_refused(change, message):
    config = bisect_config()
    config["bisect"].update(change)
    with pytest.raises(ConfigError) as error:
        check_config(config, SCHEMA, ["bad.yaml"], ROOT)
    assert message in str(error.value)


def test_dry_run_of_the_bisect_schedules_one_job_and_no_arm(tmp_path):
    finished = subprocess.run(
        snakemake_command(
            tmp_path,
            "-n",
            "results/release-bisect/bisect.json",
            config=ROOT / "config" / "bisect.yaml",
        ),
        capture_output=True,
        text=True,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    stats = finished.stdout.split("Job stats:")[1].split("\n\n")[0]
    jobs = {line.split()[0] for line in stats.splitlines()[3:] if line.strip()}
    assert jobs == {"bisect_commits", "make_workload", "preflight", "total"}


# --- one real bisect ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the CPU quota needs root")
def test_real_bisect_finds_the_commit_that_switched_to_torch_copy(
    tmp_path, sglang_0_5_23
):
    """One probe in a block beside both ends (two blocks if the first leaves it
    undecided), five runs per measurement, a few minutes (the search itself,
    over longer histories, is tested on made-up measurements above).

    The difference between the copies is made large and steady on purpose:
    OMP_WAIT_POLICY=ACTIVE keeps torch's OpenMP workers spinning after the
    first copy_() instead of for a few milliseconds after each, the study's
    mechanism made permanent. On our 2-CPU host under a 0.5-core quota the
    numpy copy then serves 2-2.7x the requests of copy_() (measured with other
    jobs on the host), where the plain mechanism gives 1.2-1.4x on tiny arms,
    too close to the noise of one short run for a test that must not depend on
    luck. Even so one run of a good commit once served half its usual rate on
    a busy CI host and was placed on the bad side, and on this VM two of three
    runs of a good probe once served 40 instead of about 60 req/s at half their
    usual CPU (the host's time taken elsewhere, unseen by the load check), so
    each commit gets five runs. The criterion compares [min, max] ranges, so one
    disturbed run can still leave the probe undecided (in CI a block once had the
    probe at 39 and the ends at 82 and 40 req/s by their medians, undecided);
    the bisect then measures the block again (``bisect.repeats``, 1 by default).
    """
    tree, _ = sglang_0_5_23
    repository = tmp_path / "sglang"
    repository.mkdir()
    shas = make_repository(repository, tree, switch_at=1, commits=3)
    config = {
        "experiment": "bisect-test",
        "engine": "embedded",
        "runtime": "local",
        "sources": [
            {"name": "good-end", "git": {"url": str(repository), "commit": shas[0]}}
        ],
        "variants": [{"name": "good-end", "source": "good-end"}],
        "workloads": [
            {
                "name": "tiny",
                "images": 8,
                "width": 256,
                "height": 256,
                "format": "png",
                "content": "noise",
                "input_tokens": 16,
            }
        ],
        "embedded_engine": {"prefill_ms_per_image": 1, "decode_step_ms": 1},
        "client": {"warmup_requests": 4, "health_timeout_s": 120},
        "arms": [
            {
                "name": "probe",
                "variant": "good-end",
                "workload": "tiny",
                "cpu_quota": 0.5,
                "environment": {"OMP_WAIT_POLICY": "ACTIVE"},
                "concurrency": 4,
                "requests": 24,
                "output_tokens": 4,
                "runs": 1,
            }
        ],
        # The test asks every run to be valid: a short window on a VM can see a
        # burst of steal, which the bisect's runs, unlike a study's, never retry.
        "host_sharing": {"max_steal_cores": 4096},
        "change_criterion": {"min_change": 0.3, "min_valid_runs": 1},
        "bisect": {
            "repository": str(repository),
            "good": "before-copy",
            "bad": shas[-1],
            "arm": "probe",
            "runs": 5,
        },
    }
    config_file = tmp_path / "bisect.yaml"
    config_file.write_text(yaml.safe_dump(config))
    workdir = tmp_path / "work"
    workdir.mkdir()

    finished = subprocess.run(
        snakemake_command(
            workdir,
            "--cores",
            "1",
            "results/bisect-test/bisect.json",
            config=config_file,
        ),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]

    result = json.loads((workdir / "results/bisect-test/bisect.json").read_text())
    summary = [(p["commit"][:8], p["role"], p["median"]) for p in result["probes"]]
    assert result["status"] == FOUND, summary
    assert result["first_bad_commit"] == shas[1], summary
    assert result["good"]["commit"] == shas[0]
    assert [probe["commit"] for probe in result["probes"]][:2] == [shas[0], shas[-1]]
    # The ends, then a block of the probe beside both ends, measured once more if
    # a disturbed run left the probe undecided.
    blocks = max(probe["block"] for probe in result["probes"])
    assert blocks in (1, 2)
    assert len(result["probes"]) == 2 + 3 * blocks
    assert result["comparisons"] == 1 + 3 * blocks
    for probe in result["probes"]:
        probe_dir = (
            workdir
            / "results/bisect-test/bisect"
            / probe["commit"][:12]
            / f"block{probe['block']}"
        )
        throughputs = []
        for run in ("run1", "run2", "run3", "run4", "run5"):
            metrics = json.loads((probe_dir / run / "metrics.json").read_text())
            assert metrics["valid"], metrics["invalid_reasons"]
            throughputs.append(metrics["throughput_rps"])
        assert statistics.median(throughputs) == pytest.approx(probe["median"])
        variant = json.loads(Path(workdir, probe["variant"]).read_text())
        assert variant["source"]["commit"] == probe["commit"]
    assert not leaked_segments()
