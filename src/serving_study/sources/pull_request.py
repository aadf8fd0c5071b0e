"""A pull request's change to SGLang's ``python/`` folder, as a patch to apply."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from serving_study.sources.git_commands import (
    GIT_FETCH_TIMEOUT_S,
    git_remote,
    require_reachable,
    run_git,
    try_git,
)
from serving_study.sources.source_errors import SourceMismatch, last_line


@dataclass(frozen=True)
class PullRequestDiff:
    """A pull request's change to ``python/``, taken against its merge base."""

    url: str
    number: int
    head_commit: str
    merge_base: str
    text: str


def fetch_pull_request_diff(
    git_url: str, number: int, base_commit: str, pinned_head: str | None = None
) -> PullRequestDiff:
    """Fetch pull request ``number`` and diff it against its merge base with a commit.

    Only the ``python/`` folder is diffed, the part of the repository a source tree
    holds. The head commit is recorded because a pull request's head moves; with
    ``pinned_head`` (a full sha) a head that has moved is refused.
    """
    where = f"pull request #{number} of {git_url}"
    pull_ref = f"refs/pull/{number}/head"
    with tempfile.TemporaryDirectory(prefix="pull-request-") as work:
        repository = Path(work)
        remote = git_remote(git_url)
        run_git(["init", "--quiet", "--bare"], repository)
        require_reachable(where, remote, repository)
        # A blobless fetch: history and trees now, file contents only as diff needs.
        for setting in (
            ["remote.origin.url", remote],
            ["remote.origin.promisor", "true"],
            ["remote.origin.partialclonefilter", "blob:none"],
        ):
            run_git(["config", *setting], repository)
        refspec = f"+{pull_ref}:{pull_ref}"
        fetched = try_git(
            ["fetch", "--quiet", "--filter=blob:none", "origin", refspec],
            repository,
            timeout=GIT_FETCH_TIMEOUT_S,
        )
        if fetched.returncode != 0:
            raise SourceMismatch(
                f"{where} could not be fetched ({last_line(fetched.stderr)}). Check "
                "the pull request number."
            )
        base = try_git(["cat-file", "-e", f"{base_commit}^{{commit}}"], repository)
        if base.returncode != 0:
            try_git(
                ["fetch", "--quiet", "--filter=blob:none", "--", "origin", base_commit],
                repository,
                timeout=GIT_FETCH_TIMEOUT_S,
            )
        head = run_git(["rev-parse", pull_ref], repository).stdout.strip()
        if pinned_head is not None and head != pinned_head:
            raise SourceMismatch(
                f"{where}: its head is commit {head}, but the config pins "
                f"{pinned_head} (pull_request_head). The pull request has moved "
                "since it was pinned: read what changed, then pin the new head, or "
                "keep the pinned change as a patch file under envs/patches/."
            )
        merge_base = try_git(["merge-base", base_commit, head], repository)
        if merge_base.returncode != 0:
            raise SourceMismatch(
                f"{where}: no merge base with commit {base_commit}. Is that commit "
                "in the same repository?"
            )
        merge_base_commit = merge_base.stdout.strip()
        diff_options = ["--no-ext-diff", "--no-color", "--binary"]
        diff_options += ["--src-prefix=a/", "--dst-prefix=b/"]
        diff = run_git(
            ["diff", *diff_options, merge_base_commit, head, "--", "python"],
            repository,
            timeout=GIT_FETCH_TIMEOUT_S,
        )
    return PullRequestDiff(git_url, number, head, merge_base_commit, diff.stdout)
