"""Names that change when what they name changes.

What a checkout keeps outside any one experiment (fetched sources, downloaded models,
wheelhouses) is shared by every experiment that asks for the same thing. Its folder is
named after its record as well as its name: two experiments that give one name two
records get two folders, so neither can rewrite what the other's runs read.
"""

import hashlib
import json


def canonical_sha256(record) -> str:
    """The sha256 of ``record`` as canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def content_key(name: str, record) -> str:
    """``name`` and the first 12 hex digits of its record's hash (48 bits: a
    collision between the few records of one checkout is out of reach)."""
    return f"{name}-{canonical_sha256(record)[:12]}"
