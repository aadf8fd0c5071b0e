"""What a run record needs to be traced to the code, config and host that made it.

Every run's provenance gets, besides what the runner saw of the server:

- this project's commit and whether its tree had uncommitted changes;
- the sha256 of the experiment's effective config (the validated, defaults-filled
  config the workflow ran, as canonical JSON), so two runs of the same settings
  show the same hash whatever files and key order they came from;
- the host's description, as preflight wrote it (host.json);
- the node the run ran on and where it differs from host.json (run_node.py);
- the versions of Python, torch and the engine under study.

Enough to rerun it: check out the commit, give the same config, use the same
engine release.
"""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

from serving_study.config.content_keys import canonical_sha256
from serving_study.config.platform import PROJECT_ROOT
from serving_study.measure.run_node import node_record

GIT_TIMEOUT_S = 30


def project_commit(root: Path = PROJECT_ROOT) -> dict:
    """The checked-out commit of ``root`` and whether tracked files differ from
    it; both None when ``root`` is not a git checkout (an unpacked release)."""

    def git(*arguments: str) -> str | None:
        try:
            finished = subprocess.run(
                ["git", "-C", str(root), *arguments],
                capture_output=True,
                text=True,
                timeout=GIT_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return finished.stdout if finished.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": commit.strip(),
        "dirty": None if status is None else bool(status.strip()),
    }


def engine_version(variant: dict) -> dict:
    """The engine release under study: the variant's source (package and version,
    or commit) and its change (patch or pull request), from its identity record."""
    source = variant["source"]
    return {
        **{key: source.get(key) for key in ("package", "version", "commit", "sha256")},
        "patch": variant.get("patch"),
        "pull_request": variant.get("pull_request"),
    }


def run_provenance(config: dict, host: dict, variant: dict) -> dict:
    """The fields every run record carries (see the module docstring)."""
    # Read from the installed distribution: importing torch took the runner ~3 s
    # of each run's wall time on 2 cores.
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    return {
        "project": project_commit(),
        "config_sha256": canonical_sha256(config),
        "host": host,
        **node_record(host),
        "versions": {
            "python": platform.python_version(),
            "torch_of_runner": torch_version,
            "engine": engine_version(variant),
        },
    }
