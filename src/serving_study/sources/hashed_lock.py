"""A closed, hashed lock: every package pinned with ``==`` and its sha256.

The real server's CPU runtime and its image install from
``envs/sglang-cpu/requirements.lock`` with ``pip install --require-hashes``; this
reads that file the way pip does (``\\`` continues a line, ``#`` starts a comment)
and refuses what pip would have to resolve, or could not check.
"""

import re
from dataclasses import dataclass

PINNED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)$")
HASH_OPTION = re.compile(r"^--hash=sha256:(?P<digest>[0-9a-f]{64})$")


class LockNotClosed(ValueError):
    """A lock line that pins no exact version or carries no sha256."""


@dataclass(frozen=True)
class LockedPackage:
    version: str
    sha256: tuple[str, ...]


def canonical_name(name: str) -> str:
    """PEP 503's normal form: ``Jinja2`` and ``jinja_2`` are ``jinja2``, ``jinja-2``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, requirement) after joining ``\\`` continuations and
    dropping comments and blank lines."""
    found, pending, started = [], "", 0
    for number, line in enumerate(text.splitlines(), 1):
        content = line.split("#", 1)[0].rstrip()
        if not pending:
            started = number
        if content.endswith("\\"):
            pending += content[:-1] + " "
            continue
        requirement = " ".join((pending + content).split())
        pending = ""
        if requirement:
            found.append((started, requirement))
    return found


def read_hashed_lock(text: str, where: str) -> dict[str, LockedPackage]:
    """Canonical name -> pinned version and sha256 digests, for every package."""
    packages: dict[str, LockedPackage] = {}
    for number, requirement in logical_lines(text):
        pin, *options = requirement.split()
        match = PINNED.match(pin)
        digests = [HASH_OPTION.match(option) for option in options]
        if match is None:
            raise LockNotClosed(
                f"{where}:{number}: {requirement!r} is not pinned as name==version;"
                " the lock must list every package exactly"
            )
        if not digests or not all(digests):
            raise LockNotClosed(
                f"{where}:{number}: {pin} carries no --hash=sha256:<64 hex> (or an"
                " option other than --hash); pip --require-hashes needs one per package"
            )
        packages[canonical_name(match["name"])] = LockedPackage(
            match["version"], tuple(digest["digest"] for digest in digests)
        )
    if not packages:
        raise LockNotClosed(f"{where}: the lock lists no packages")
    return packages
