"""The config schema, the one place that states every key's limits and default.

config/schema/config.schema.yaml says what each key may hold, and validation.py
checks a whole config against it before any job runs. Code that needs a limit or a
default of a key (the workload generator, given a spec without a config) reads it
here instead of restating the number, so that every config the check accepts is
one every job can run.
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from serving_study.config.platform import PROJECT_ROOT

SCHEMA_PATH = PROJECT_ROOT / "config" / "schema" / "config.schema.yaml"


@functools.cache
def load_schema(schema_path: Path) -> dict:
    """A schema file, parsed once per process; callers must not change it."""
    return yaml.safe_load(Path(schema_path).read_text())


def config_schema() -> dict:
    return load_schema(SCHEMA_PATH)


def resolved(node: dict) -> dict:
    """``node`` with its ``$ref`` (``#/$defs/...``) replaced by what it names; the
    node's own keywords (a default, a description) win over the definition's."""
    if "$ref" not in node:
        return node
    target = config_schema()
    for part in node["$ref"].removeprefix("#/").split("/"):
        target = target[part]
    own = {key: value for key, value in node.items() if key != "$ref"}
    return resolved(target) | own


def property_schema(*keys: str) -> dict:
    """The schema of one config key, e.g. ``property_schema("workloads",
    "jpeg_quality")``; a list key stands for any one of its items."""
    node = config_schema()
    for key in keys:
        node = resolved(node)
        if "items" in node:
            node = resolved(node["items"])
        node = node["properties"][key]
    node = resolved(node)
    return resolved(node["items"]) if "items" in node else node
