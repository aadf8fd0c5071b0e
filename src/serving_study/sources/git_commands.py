"""Running git for a fetch: never prompting, never touching a caller's repository,
and saying plainly when a remote cannot be reached."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from serving_study.sources.source_errors import (
    SourceError,
    SourceUnavailable,
    last_line,
)

# Seconds before a network step counts as unreachable rather than slow.
GIT_PROBE_TIMEOUT_S = 60
GIT_FETCH_TIMEOUT_S = 1800


def git_environment() -> dict:
    """The environment for git: never prompt, never pick up a caller's repository,
    and only the usual transports (no ``ext::`` command, whatever a user's
    gitconfig allows)."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")
    }
    environment["GIT_TERMINAL_PROMPT"] = "0"
    environment["GIT_ALLOW_PROTOCOL"] = "https:http:ssh:git:file"
    return environment


def try_git(
    arguments: list[str], cwd: Path, timeout: float = GIT_PROBE_TIMEOUT_S
) -> subprocess.CompletedProcess:
    """Run git and return the result whatever its exit status."""
    try:
        return subprocess.run(
            ["git", *arguments],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=git_environment(),
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(
            ["git", *arguments], 124, "", f"timed out after {timeout} s"
        )


def run_git(
    arguments: list[str], cwd: Path, timeout: float = GIT_PROBE_TIMEOUT_S
) -> subprocess.CompletedProcess:
    """Run git and raise SourceError if it fails."""
    result = try_git(arguments, cwd, timeout=timeout)
    if result.returncode != 0:
        raise SourceError(
            f"git {' '.join(arguments)} failed: {last_line(result.stderr)}"
        )
    return result


def git_remote(url: str) -> str:
    """Return ``url`` with a local path made absolute (git runs in a temp directory)."""
    local = Path(url).expanduser()
    if "://" not in url and local.exists():
        return str(local.resolve())
    return url


def require_reachable(what: str, url: str, repository: Path) -> None:
    """Raise SourceUnavailable, with the offline way out, if ``url`` is unreachable."""
    probe = try_git(["ls-remote", "--quiet", "--", url, "HEAD"], repository)
    if probe.returncode != 0:
        raise SourceUnavailable(
            f"{what}: cannot reach {url} ({last_line(probe.stderr)}). If "
            "this machine is offline, make a local copy elsewhere (a clone, or a "
            "wheel) and point the config at it with 'path:' (or 'git: {url: "
            "/local/clone}')."
        )
