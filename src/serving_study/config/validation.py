"""Checking an experiment's config before any job runs.

The JSON schema (config/schema/config.schema.yaml) says what each key may hold;
this module applies it (``key_problems``: to one piece of a config), fills in the
schema's defaults, and adds the checks a schema cannot express: names that must be
unique, and names that must refer to something defined elsewhere in the same
config. Every problem becomes one line that names the file and the key, e.g.
``config/b1.yaml: arms[2].variant: 'patchd' names no variant (known: original,
patched)``.
"""

import copy
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import jsonschema

from serving_study.config.deprecated_keys import replace_deprecated_keys
from serving_study.config.schema import config_schema, load_schema, property_schema
from serving_study.config.secrets import secret_problems
from serving_study.config.section_checks import (
    bisect_problems,
    crosscheck_problems,
    fixes_problems,
    host_torch_problems,
    must_name,
    release_series_problems,
    server_argument_problems,
    thread_quota_map_problems,
    tiny_model_problems,
)


class ConfigError(ValueError):
    """The config is wrong; the message names the file, the key and the fix."""


def key_path(parts: Iterable) -> str:
    """Render a JSON path like ``arms[2].cpu_quota``."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


def _fill_defaults(validator_class):
    """A validator class that also writes each property's default into the config."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def properties_with_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.copy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(
        validator_class, {"properties": properties_with_defaults}
    )


_DefaultFillingValidator = _fill_defaults(jsonschema.Draft202012Validator)


def _schema_message(error: jsonschema.ValidationError, root: Sequence = ()) -> str:
    path = list(error.absolute_path)
    where = key_path([*root, *path])
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        allowed = ", ".join(sorted(error.schema.get("properties", {})))
        return (
            f"{where}: unknown key {', '.join(map(repr, unknown))} (allowed: {allowed})"
        )
    if (
        error.validator == "anyOf"
        and list(error.schema_path)[-2:-1] == ["propertyNames"]
        and path[-1:] == ["environment"]
    ):
        known = next(
            (choice["enum"] for choice in error.schema["anyOf"] if "enum" in choice),
            [],
        )
        return (
            f"{where}.{error.instance}: not a thread variable this study knows; "
            f"use one of {', '.join(known)}"
        )
    if (
        error.validator in ("pattern", "enum")
        and path[-2:-1] == ["environment"]
        and "description" in error.schema
    ):
        return (
            f"{where}: {error.instance!r} is not allowed; give "
            f"{error.schema['description'].strip()}"
        )
    if error.validator == "oneOf" and (
        path[-1:] == ["cpu_quota"] or path[-2:-1] == ["cpu_quotas"]
    ):
        return (
            f"{where}: {error.instance!r} is not a CPU quota: give a number of cores "
            'greater than 0, or "none" to run without a quota'
        )
    if error.validator == "oneOf" and len(path) == 2 and path[0] == "sources":
        return f"{where}: a source needs exactly one of 'pypi', 'git' or 'path'"
    return f"{where}: {error.message}"


def schema_problems(config: dict, schema: dict) -> list[str]:
    """Validate against the schema, filling defaults in place; return the problems."""
    validator = _DefaultFillingValidator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    return [_schema_message(error) for error in errors]


def key_problems(value, *keys: str, root: Sequence = ()) -> list[str]:
    """Check ``value`` against the schema of the config key at ``keys`` (a list key
    stands for one of its items), filling defaults in place; ``root`` names the
    value in the problems, as ``key_path`` parts."""
    validator = _DefaultFillingValidator(config_schema()).evolve(
        schema=property_schema(*keys)
    )
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    return [_schema_message(error, root) for error in errors]


def _duplicates(records: Sequence[dict], collection: str) -> list[str]:
    counts = Counter(record.get("name") for record in records)
    return [
        f"{collection}[{index}].name: {record['name']!r} is used more than once; "
        f"each {collection[:-1]} needs its own name"
        for index, record in enumerate(records)
        if counts[record.get("name")] > 1
    ]


def reference_problems(config: dict, project_root: Path) -> list[str]:
    """Names that must be unique or must refer to a record defined elsewhere."""
    problems: list[str] = []
    for collection in ("sources", "variants", "workloads", "arms"):
        problems += _duplicates(config.get(collection, []), collection)

    sources = {source["name"]: source for source in config.get("sources", [])}
    for index, variant in enumerate(config.get("variants", [])):
        where = f"variants[{index}]"
        source = sources.get(variant["source"], {})
        problems += must_name(variant["source"], sources, f"{where}.source", "source")
        if "patch" in variant and not (project_root / variant["patch"]).is_file():
            problems.append(
                f"{where}.patch: {variant['patch']!r} does not exist; put the patch "
                "file under envs/patches/"
            )
        if "pull_request" in variant and "patch" in variant:
            problems.append(f"{where}: give either 'patch' or 'pull_request', not both")
        if "pull_request" in variant and "git" not in source:
            problems.append(
                f"{where}.pull_request: a pull request can only be applied to a git "
                "source; give the variant a source with 'git'"
            )

    variant_names = [variant["name"] for variant in config.get("variants", [])]
    workload_names = [workload["name"] for workload in config.get("workloads", [])]
    arm_names = [arm["name"] for arm in config.get("arms", [])]
    for index, arm in enumerate(config.get("arms", [])):
        where = f"arms[{index}]"
        for key, known in (("variant", variant_names), ("workload", workload_names)):
            problems += must_name(arm[key], known, f"{where}.{key}", key)
        if config.get("engine") == "embedded" and arm.get("server_args"):
            problems.append(
                f"{where}.server_args: only engine 'sglang' takes server arguments"
            )
        if arm.get("quota_scope") == "main_process" and (
            config.get("engine") != "sglang" or config.get("runtime") != "local"
        ):
            problems.append(
                f"{where}.quota_scope: main_process needs engine 'sglang' and runtime "
                "'local' (it moves SGLang's scheduler out of the quota's cgroup); "
                "use quota_scope: server"
            )
        for name in arm.get("secret_environment", []):
            if name in arm.get("environment", {}):
                problems.append(
                    f"{where}.secret_environment: {name} is also set in "
                    f"{where}.environment; give it in one place"
                )
        if config.get("engine") != "embedded" and "intra_op_threads" in arm:
            problems.append(
                f"{where}.intra_op_threads: only the embedded engine can force its "
                "intra-op threads; give SGLang OMP_NUM_THREADS in 'environment'"
            )

    for index, reference in enumerate(config.get("reference", {}).get("arms", [])):
        problems += must_name(
            reference["arm"], arm_names, f"reference.arms[{index}].arm", "arm"
        )
    problems += fixes_problems(config.get("fixes"), config.get("arms", []))
    problems += _duplicates(config.get("claims", []), "claims")
    for index, claim in enumerate(config.get("claims", [])):
        where = f"claims[{index}]"
        for key in ("numerator", "denominator"):
            if key in claim:
                problems += must_name(claim[key], arm_names, f"{where}.{key}", "arm")
        for position, arm in enumerate(claim.get("arms", [])):
            problems += must_name(arm, arm_names, f"{where}.arms[{position}]", "arm")
        has_ratio = "numerator" in claim and "denominator" in claim
        if not has_ratio and not claim.get("arms"):
            problems.append(
                f"{where}: a claim compares either numerator/denominator arms or a "
                "list of 'arms' within a tolerance"
            )
    sglang = config.get("sglang", {})
    if "tiny_model" in sglang and sglang.get("model_path"):
        problems.append(
            "sglang: give either tiny_model or model_path, not both (tiny_model "
            "makes its own model)"
        )
    problems += host_torch_problems(config)
    problems += tiny_model_problems(sglang.get("tiny_model"))
    problems += release_series_problems(config)
    problems += bisect_problems(config, arm_names)
    problems += thread_quota_map_problems(config, variant_names, workload_names)
    problems += crosscheck_problems(config, arm_names)
    problems += server_argument_problems(config)
    return problems


def sorted_mappings(value):
    """``value`` with every mapping's keys in sorted order (lists keep theirs)."""
    if isinstance(value, dict):
        return {key: sorted_mappings(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sorted_mappings(item) for item in value]
    return value


def check_config(
    config: dict, schema_path: Path, config_files: Sequence[str], project_root: Path
) -> dict:
    """Validate ``config`` in place (defaults filled, every mapping's keys sorted)
    or raise one ConfigError.

    ``config_files`` are the files the config was merged from, named in the message.
    The order of keys in a YAML file is no setting, but Snakemake compares a job's
    params as written: a config whose keys were merely reordered would re-measure
    every run that takes a mapping of it.
    """
    source = " + ".join(str(path) for path in config_files) or "the config"
    # Before the schema, whose messages may quote a value: a config that holds a
    # secret gets only the lines that name where (secrets.py).
    problems = secret_problems(config) or replace_deprecated_keys(config)
    if not problems:
        problems = schema_problems(config, load_schema(schema_path))
    if not problems:
        problems = reference_problems(config, project_root)
    if problems:
        raise ConfigError("\n".join(f"{source}: {problem}" for problem in problems))
    checked = sorted_mappings(config)
    config.clear()
    config.update(checked)
    return config
