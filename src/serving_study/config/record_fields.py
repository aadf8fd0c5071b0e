"""How a typed record reads its section of the config (records.py): each named
value, or the schema's default where the section lacks it, and its plain fields
converted to the types their annotations name."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping

from serving_study.config.schema import property_schema


def config_values(section: Mapping, names: Iterable[str], *keys: str) -> dict:
    """``section``'s value of each of ``names``, the key path ``keys`` of the schema
    saying what one it lacks takes: the default, or None where the schema gives
    none. A required key that is missing is an error.

    The schema is read only when something is missing: a job's params carry
    every value (``as_config``), so a job never reads it.
    """
    names = tuple(names)
    missing = [name for name in names if name not in section]
    if not missing:
        return {name: section[name] for name in names}
    schema = property_schema(*keys)
    absent = [name for name in missing if name in schema.get("required", ())]
    if absent:
        raise ValueError(f"{'.'.join(keys)} lacks {', '.join(absent)}")
    properties = schema["properties"]
    return {
        name: section[name]
        if name in section
        else copy.deepcopy(properties.get(name, {}).get("default"))
        for name in names
    }


def field_names(record: type) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(record))


# The field types (annotations are strings here) whose config value a record takes
# converted as it is; a record builds its other fields itself.
PLAIN_TYPES = {"str": str, "int": int, "float": float}


def plain_fields(record: type, values: Mapping) -> dict:
    """``values`` of ``record``'s str, int and float fields, each converted to the
    type its annotation names."""
    return {
        field.name: PLAIN_TYPES[field.type](values[field.name])
        for field in dataclasses.fields(record)
        if field.type in PLAIN_TYPES
    }


def given(values: Mapping) -> dict:
    """``values`` without the keys that hold nothing (optional keys not set)."""
    return {name: value for name, value in values.items() if value is not None}
