"""Every limit of the config schema is enforced before any job runs.

The schema is the one place that states a key's limits, so each of them must
reach the check Snakemake runs first (``check_config``). This walks the schema to
every key a limit applies to (following ``$ref``, into lists and alternatives),
sets that key of the default config just outside the limit, and expects the check
to refuse the config with a line that names the key.
"""

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from serving_study.config.schema import config_schema, property_schema, resolved
from serving_study.config.validation import ConfigError, check_config, key_path

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema" / "config.schema.yaml"
LIMITS = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minItems",
    "enum",
    "pattern",
)
# Valid sections for the optional keys the default config leaves out and whose
# records have required keys: a limit inside them is tested within one of these.
OPTIONAL_SECTIONS = {
    "bisect": {"repository": "repo", "good": "v1", "bad": "v2", "arm": "A"},
    "thread_quota_map": {
        "variants": ["original"],
        "workload": "fresh-512",
        "intra_op_threads": [1],
        "cpu_quotas": [0.5],
    },
}


def limits(node: dict, path: tuple = (), names_of: tuple | None = None):
    """Yield (path, keyword, node) for each limit: ``path`` is where it applies in
    a config (0 for a list's first item); ``names_of`` is set when the limit is on
    the property names of the record at that path rather than on a value."""
    node = resolved(node)
    for keyword in LIMITS:
        if keyword in node:
            yield path, keyword, node, names_of
    for name, child in node.get("properties", {}).items():
        yield from limits(child, (*path, name))
    if isinstance(node.get("items"), dict):
        yield from limits(node["items"], (*path, 0))
    if isinstance(node.get("propertyNames"), dict):
        yield from limits(node["propertyNames"], path, names_of=path)
    for alternative in node.get("oneOf", []) + node.get("anyOf", []):
        yield from limits(alternative, path, names_of)


CASES = {
    f"{key_path(path)}{' names' if names_of else ''} {keyword}": (
        path,
        keyword,
        node,
        names_of,
    )
    for path, keyword, node, names_of in limits(config_schema())
}


def just_outside(keyword: str, node: dict, current):
    """A value next to the limit but outside it."""
    step = 1 if node.get("type") == "integer" else 0.001
    bound = node.get(keyword)
    if keyword == "minimum":
        return bound - step
    if keyword == "maximum":
        return bound + step
    if keyword in ("exclusiveMinimum", "exclusiveMaximum"):
        return bound
    if keyword == "multipleOf":
        return node.get("minimum", bound) + 1
    if keyword == "minLength":
        return "a" * (bound - 1)
    if keyword == "maxLength":
        return "a" * (bound + 1)
    if keyword == "minItems":
        return list(current or [])[: bound - 1]
    if keyword == "enum":
        assert all(isinstance(choice, str) for choice in bound), node
        return f"{bound[0]}_unknown"
    # A pattern: the shortest of these values that it does not match.
    refused = [text for text in ("", "-", "\n") if not re.search(bound, text)]
    assert refused, f"pattern {bound!r} matches every probe"
    return refused[0]


def default_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def place(config: dict, path: tuple, value) -> None:
    """Set ``config`` at ``path``, making the records and lists on the way."""
    target = config
    for part, following in zip(path, path[1:], strict=False):
        if isinstance(target, list) and part >= len(target):
            target.append({} if isinstance(following, str) else [])
        elif isinstance(target, dict) and part not in target:
            target[part] = copy.deepcopy(
                OPTIONAL_SECTIONS.get(part, {} if isinstance(following, str) else [])
            )
        target = target[part]
    if isinstance(target, list) and path[-1] >= len(target):
        target.append(value)
    else:
        target[path[-1]] = value


def current_value(config: dict, path: tuple):
    target = config
    for part in path:
        try:
            target = target[part]
        except (KeyError, IndexError):
            return None
    return target


def test_the_walk_reaches_every_kind_of_limit():
    assert len(CASES) == len(list(limits(config_schema())))  # no case hides another
    kinds = {keyword for _, keyword, _, _ in CASES.values()}
    assert {"minimum", "maximum", "exclusiveMinimum", "enum", "pattern"} <= kinds
    assert "workloads[0].jpeg_quality maximum" in CASES
    assert "arms[0].cpu_quota exclusiveMinimum" in CASES  # through oneOf and $ref
    assert "arms[0].environment names enum" in CASES  # thread variable names


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_value_just_outside_a_limit_is_refused_naming_the_key(case):
    path, keyword, node, names_of = CASES[case]
    config = default_config()
    if names_of is None:
        value = just_outside(keyword, node, current_value(config, path))
        place(config, path, value)
    else:
        value = just_outside(keyword, node, None)
        place(config, (*names_of, value), "1")
    with pytest.raises(ConfigError) as refused:
        check_config(config, SCHEMA, ["bad.yaml"], ROOT)
    where = f"bad.yaml: {key_path(path)}"
    lines = str(refused.value).splitlines()
    assert any(line.startswith(where) for line in lines), (value, lines)


def defaults(node: dict, path: tuple = ()):
    """Yield (path, node) for every property schema that has a default."""
    node = resolved(node)
    if "default" in node and path:
        yield path, node
    for name, child in node.get("properties", {}).items():
        yield from defaults(child, (*path, name))
    if isinstance(node.get("items"), dict):
        yield from defaults(node["items"], (*path, 0))


DEFAULTS = {key_path(path): node for path, node in defaults(config_schema())}


@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_every_default_lies_within_its_own_limits(key):
    node = DEFAULTS[key]
    validator = jsonschema.Draft202012Validator(config_schema()).evolve(schema=node)
    assert list(validator.iter_errors(node["default"])) == []


def test_the_tiny_models_vision_width_splits_into_its_heads():
    """The schema states the tiny model's head split so the pre-job check can
    refuse a width it cannot split; the model's own constant must agree."""
    from serving_study.sources.tiny_model_settings import VISION_HEADS

    node = property_schema("sglang", "tiny_model", "vision_hidden_size")
    assert node["multipleOf"] == 2 * VISION_HEADS
