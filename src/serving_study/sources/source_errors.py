"""What can go wrong fetching a source, and how a failing tool is quoted."""

from __future__ import annotations


class SourceError(Exception):
    """A source could not be fetched as the config pins it."""


class SourceUnavailable(SourceError):
    """The source cannot be reached (offline, wrong URL, missing local path)."""


class SourceMismatch(SourceError):
    """The source was reached but is not what the config pins (sha256, commit)."""


def last_line(output: str) -> str:
    """The last non-blank line of a tool's output, for an error message."""
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
