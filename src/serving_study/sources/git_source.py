"""Fetching one pinned commit of SGLang's repository: its whole ``python/`` folder.

A server gives a commit by sha only when the whole sha is asked for, and some refuse
even that; then every branch and tag is fetched and the sha resolved among them. An
abbreviated sha is accepted, with a warning, and recorded in full.
"""

from __future__ import annotations

import logging
import re
import tarfile
import tempfile
from pathlib import Path

from serving_study.sources.git_commands import (
    GIT_FETCH_TIMEOUT_S,
    git_remote,
    require_reachable,
    run_git,
    try_git,
)
from serving_study.sources.package_extraction import PACKAGE, refuse_oversized
from serving_study.sources.source_errors import SourceMismatch

logger = logging.getLogger(__name__)

FULL_COMMIT = re.compile(r"[0-9a-f]{40}")
# What a git source may pin (fullmatch): a sha, never a value git reads as an option.
PINNED_COMMIT = re.compile(r"[0-9a-f]{7,40}")
# Every branch and tag: what is fetched when a commit cannot be asked for by sha.
ALL_REFS = ("+refs/heads/*:refs/remotes/source/*", "+refs/tags/*:refs/tags/*")


def fetch_git_source(record: dict, staging: Path, download_dir: Path | None) -> dict:
    """Lay out the ``python/`` folder of the pinned commit in ``staging``."""
    pin = record["git"]
    url, commit = pin["url"], pin["commit"]
    name = record["name"]
    if not PINNED_COMMIT.fullmatch(commit):
        raise SourceMismatch(
            f"source {name!r}: git.commit {commit!r} is not a commit sha (7 to 40 "
            "hex digits)"
        )
    with tempfile.TemporaryDirectory(dir=staging.parent, prefix=".git-") as work:
        repository = Path(work)
        remote = git_remote(url)
        run_git(["init", "--quiet"], repository)
        require_reachable(f"source {name!r}", remote, repository)
        # An abbreviated sha (all the study published for B1's base) needs the history.
        fetched = (
            try_git(["fetch", "--quiet", "--depth=1", "--", remote, commit], repository)
            if FULL_COMMIT.fullmatch(commit)
            else None
        )
        if fetched is None or fetched.returncode != 0:
            try_git(
                ["fetch", "--quiet", "--", remote, *ALL_REFS],
                repository,
                timeout=GIT_FETCH_TIMEOUT_S,
            )
        resolved = try_git(
            ["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], repository
        )
        full_commit = resolved.stdout.strip()
        if resolved.returncode != 0 or not full_commit.startswith(commit):
            raise SourceMismatch(
                f"source {name!r}: commit {commit} was not found in {url}. Check the "
                "commit in the config: it must be a sha (best all 40 digits) that "
                "exists there."
            )
        if full_commit != commit:
            logger.warning(
                "source %r: abbreviated commit %s resolved to %s; pin the full sha",
                name,
                commit,
                full_commit,
            )
        commit = full_commit
        package = try_git(["cat-file", "-e", f"{commit}:python/{PACKAGE}"], repository)
        if package.returncode != 0:
            raise SourceMismatch(
                f"source {name!r}: commit {commit} of {url} has no python/{PACKAGE} "
                "folder. Is this SGLang's repository?"
            )
        snapshot = repository / "python.tar"
        run_git(
            ["archive", "--format=tar", f"--output={snapshot}", commit, "python"],
            repository,
            timeout=GIT_FETCH_TIMEOUT_S,
        )
        with tarfile.open(snapshot) as tar:
            listed = tar.getmembers()
            refuse_oversized(snapshot, len(listed), sum(m.size for m in listed))
            try:
                tar.extractall(staging, filter="data")
            except tarfile.FilterError as refused:
                raise SourceMismatch(
                    f"source {name!r}: the git archive of {commit} in {url} has a "
                    f"member that would leave the tree: {refused}"
                ) from None
    return {"kind": "git", "url": url, "commit": commit}
