"""The first-parent history between two commits of a git repository, for a bisect.

The repository is cloned bare into a temporary directory (without file contents
when remote); the commits from good to bad along bad's first-parent history are the
bisect's candidates, good first.
"""

import subprocess
import tempfile
from pathlib import Path

from serving_study.sources.git_commands import git_environment

GIT_TIMEOUT_S = 1800


class BisectError(RuntimeError):
    """The bisect cannot start: the repository or its ends are not usable."""


def first_parent_commits(repository: str, good: str, bad: str) -> list[str]:
    """Full shas from good to bad along bad's first-parent history, good first;
    ``good`` and ``bad`` may be shas or tags."""
    local = Path(repository).expanduser()
    source = str(local.resolve()) if local.exists() else repository
    with tempfile.TemporaryDirectory(prefix="bisect-history-") as work:
        clone = Path(work) / "repository.git"
        without_contents = [] if local.exists() else ["--filter=blob:none"]
        _git(
            ["clone", "--quiet", "--bare", *without_contents, "--", source, str(clone)],
            Path(work),
            what=f"cloning {repository}",
        )
        good_commit = _resolve(clone, good, "good", repository)
        bad_commit = _resolve(clone, bad, "bad", repository)
        if good_commit == bad_commit:
            raise BisectError(
                f"bisect: good ({good}) and bad ({bad}) are the same commit "
                f"{good_commit}; give the commit before the change as good"
            )
        ancestor = _git(
            ["merge-base", "--is-ancestor", good_commit, bad_commit], clone, check=False
        )
        if ancestor.returncode != 0:
            raise BisectError(
                f"bisect: good ({good}) is not an ancestor of bad ({bad}) in "
                f"{repository}; give as good a commit on bad's history, e.g. "
                "git merge-base of the two"
            )
        listed = _git(
            ["rev-list", "--first-parent", "--reverse", f"{good_commit}..{bad_commit}"],
            clone,
        ).stdout.split()
    return [good_commit, *listed]


def _resolve(clone: Path, revision: str, end: str, repository: str) -> str:
    # rev-parse takes no "--" before a revision (git before 2.43).
    if revision.startswith("-"):
        raise BisectError(
            f"bisect.{end}: {revision!r} starts with '-'; give a commit or a tag"
        )
    resolved = _git(
        ["rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
        clone,
        check=False,
    )
    if resolved.returncode != 0:
        raise BisectError(
            f"bisect.{end}: {revision!r} is neither a commit nor a tag of "
            f"{repository}; check the config"
        )
    return resolved.stdout.strip()


def _git(
    arguments: list[str], cwd: Path, what: str = "", check: bool = True
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["git", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
        env=git_environment(),
    )
    if check and result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BisectError(f"{what or 'git ' + arguments[0]} failed: {last}")
    return result
