"""Wrong configs fail before any job runs, with one line naming the file and the key."""

import copy
import re
from pathlib import Path

import pytest
import yaml
from study_helpers import snakemake_refuses

from serving_study.config.validation import ConfigError, check_config

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "config" / "schema" / "config.schema.yaml"
SHIPPED = sorted(
    str(path.relative_to(ROOT))
    for path in (ROOT / "config").rglob("*.yaml")
    if path.name != "config.schema.yaml"
)


def default_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def check(config: dict) -> dict:
    return check_config(config, SCHEMA, ["bad.yaml"], ROOT)


def set_key(config: dict, path: list, value) -> None:
    target = config
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value


def delete_key(config: dict, path: list) -> None:
    target = config
    for part in path[:-1]:
        target = target[part]
    del target[path[-1]]


# Each case: how to break the default config, and what the message must contain.
BAD_CONFIGS = {
    "unknown top-level key": (lambda c: set_key(c, ["arm"], []), "unknown key 'arm'"),
    "unknown arm key": (
        lambda c: set_key(c, ["arms", 0, "cpus"], 2),
        "arms[0]: unknown key 'cpus'",
    ),
    "zero quota": (
        lambda c: set_key(c, ["arms", 1, "cpu_quota"], 0),
        "arms[1].cpu_quota: 0 is not a CPU quota",
    ),
    "negative quota": (
        lambda c: set_key(c, ["arms", 1, "cpu_quota"], -2),
        "arms[1].cpu_quota: -2 is not a CPU quota",
    ),
    "quota as a word": (
        lambda c: set_key(c, ["arms", 0, "cpu_quota"], "unlimited"),
        "arms[0].cpu_quota: 'unlimited' is not a CPU quota",
    ),
    "concurrency as string": (
        lambda c: set_key(c, ["arms", 0, "concurrency"], "16"),
        "arms[0].concurrency: '16' is not of type 'integer'",
    ),
    "zero runs": (
        lambda c: set_key(c, ["arms", 2, "runs"], 0),
        "arms[2].runs: 0 is less than the minimum of 1",
    ),
    "duplicate arm": (
        lambda c: set_key(c, ["arms", 1, "name"], "A"),
        "arms[1].name: 'A' is used more than once",
    ),
    "missing variant": (
        lambda c: set_key(c, ["arms", 1, "variant"], "patchd"),
        "arms[1].variant: 'patchd' names no variant (known: original, patched)",
    ),
    "missing workload": (
        lambda c: set_key(c, ["arms", 0, "workload"], "fresh-1024"),
        "arms[0].workload: 'fresh-1024' names no workload",
    ),
    "variant of a missing source": (
        lambda c: set_key(c, ["variants", 0, "source"], "sglang-0.5.24"),
        "variants[0].source: 'sglang-0.5.24' names no source",
    ),
    "patch file absent": (
        lambda c: set_key(c, ["variants", 1, "patch"], "envs/patches/nope.patch"),
        "variants[1].patch: 'envs/patches/nope.patch' does not exist",
    ),
    "patch outside envs/patches": (
        lambda c: set_key(c, ["variants", 1, "patch"], "/etc/passwd"),
        "variants[1].patch: '/etc/passwd' does not match",
    ),
    "pull request on a PyPI source": (
        lambda c: set_key(c, ["variants", 0, "pull_request"], 48881),
        "variants[0].pull_request: a pull request can only be applied to a git source",
    ),
    "patch and pull request together": (
        lambda c: set_key(c, ["variants", 1, "pull_request"], 48881),
        "variants[1]: give either 'patch' or 'pull_request', not both",
    ),
    "source with two origins": (
        lambda c: set_key(c, ["sources", 0, "path"], "/tmp/sglang.whl"),
        "sources[0]: a source needs exactly one of 'pypi', 'git' or 'path'",
    ),
    "short git commit": (
        lambda c: set_key(
            c, ["sources", 0], {"name": "up", "git": {"url": "x", "commit": "14"}}
        ),
        "sources[0].git.commit: '14' does not match",
    ),
    "unknown transport": (
        lambda c: set_key(c, ["arms", 0, "transport"], "shm"),
        "arms[0].transport: 'shm' is not one of ['cpu', 'cuda_ipc']",
    ),
    "unknown engine": (
        lambda c: set_key(c, ["engine"], "vllm"),
        "engine: 'vllm' is not one of ['embedded', 'sglang']",
    ),
    "missing arms": (
        lambda c: delete_key(c, ["arms"]),
        "'arms' is a required property",
    ),
    "environment value not a string": (
        lambda c: set_key(c, ["arms", 1, "environment"], {"OMP_NUM_THREADS": 1}),
        "arms[1].environment.OMP_NUM_THREADS: 1 is not of type 'string'",
    ),
    "experiment name with a slash": (
        lambda c: set_key(c, ["experiment"], "../elsewhere"),
        "experiment: '../elsewhere' does not match",
    ),
    "claim naming a missing arm": (
        lambda c: set_key(c, ["claims", 0, "numerator"], "Z"),
        "claims[0].numerator: 'Z' names no arm",
    ),
    "reference figure that is no metric": (
        lambda c: set_key(c, ["reference", "arms", 0, "throughput"], 8.6),
        "reference.arms[0]: 'throughput' is not valid under any of the given schemas",
    ),
    "workload seed below zero": (
        lambda c: set_key(c, ["workloads", 0, "seed"], -1),
        "workloads[0].seed: -1 is less than the minimum of 0",
    ),
    "JPEG quality above 100": (
        lambda c: set_key(c, ["workloads", 0, "jpeg_quality"], 101),
        "workloads[0].jpeg_quality: 101 is greater than the maximum of 100",
    ),
    "tiny model vision width that no head split takes": (
        lambda c: set_key(c, ["sglang"], {"tiny_model": {"vision_hidden_size": 20}}),
        "sglang.tiny_model.vision_hidden_size: 20 is not a multiple of 8",
    ),
    "reference for a missing arm": (
        lambda c: set_key(c, ["reference", "arms", 0, "arm"], "Z"),
        "reference.arms[0].arm: 'Z' names no arm",
    ),
    "main-process quota on the embedded engine": (
        lambda c: set_key(c, ["arms", 0, "quota_scope"], "main_process"),
        "arms[0].quota_scope: main_process needs engine 'sglang' and runtime 'local'",
    ),
    "unknown quota scope": (
        lambda c: set_key(c, ["arms", 0, "quota_scope"], "scheduler"),
        "arms[0].quota_scope: 'scheduler' is not one of ['server', 'main_process']",
    ),
    "unknown SGLang device": (
        lambda c: set_key(c, ["sglang"], {"device": "tpu"}),
        "sglang.device: 'tpu' is not one of ['auto', 'cpu', 'cuda']",
    ),
    "tiny model and a local model together": (
        lambda c: set_key(
            c, ["sglang"], {"tiny_model": {"seed": 1}, "model_path": "/data/qwen"}
        ),
        "sglang: give either tiny_model or model_path, not both",
    ),
    "tiny model dtype": (
        lambda c: set_key(c, ["sglang"], {"tiny_model": {"dtype": "float16"}}),
        "sglang.tiny_model.dtype: 'float16' is not one of ['float32', 'bfloat16']",
    ),
    "server_args on the embedded engine": (
        lambda c: set_key(c, ["arms", 0, "server_args"], ["--foo"]),
        "arms[0].server_args: only engine 'sglang' takes server arguments",
    ),
    # Hostile values: a trailing newline ($ matches before one in Python's re), a
    # value git, pip, docker or SGLang would read as an option, a path that leaves
    # its place, a flag the config sets in a spelling SGLang abbreviates.
    "experiment name with a trailing newline": (
        lambda c: set_key(c, ["experiment"], "embedded-b1\n"),
        "experiment: 'embedded-b1\\n' does not match",
    ),
    "arm name with a trailing newline": (
        lambda c: set_key(c, ["arms", 0, "name"], "A\n"),
        "arms[0].name: 'A\\n' does not match",
    ),
    "environment variable with a trailing newline": (
        lambda c: set_key(c, ["arms", 1, "environment"], {"OMP_NUM_THREADS\n": "1"}),
        "arms[1].environment: 'OMP_NUM_THREADS\\n' does not match",
    ),
    "PyPI package that is a pip option": (
        lambda c: set_key(c, ["sources", 0, "pypi", "package"], "--index-url=http://x"),
        "sources[0].pypi.package: '--index-url=http://x' does not match",
    ),
    "PyPI version with a trailing newline": (
        lambda c: set_key(c, ["sources", 0, "pypi", "version"], "0.5.23\n"),
        "sources[0].pypi.version: '0.5.23\\n' does not match",
    ),
    "git URL that is a git option": (
        lambda c: set_key(
            c,
            ["sources", 0],
            {"name": "up", "git": {"url": "--upload-pack=touch /x", "commit": "a" * 7}},
        ),
        "sources[0].git.url: '--upload-pack=touch /x' does not match",
    ),
    "git commit with a trailing newline": (
        lambda c: set_key(
            c,
            ["sources", 0],
            {"name": "up", "git": {"url": "x", "commit": "a" * 7 + "\n"}},
        ),
        "sources[0].git.commit: 'aaaaaaa\\n' does not match",
    ),
    "local source path that is an option": (
        lambda c: set_key(c, ["sources", 0], {"name": "up", "path": "-r/etc/passwd"}),
        "sources[0].path: '-r/etc/passwd' does not match",
    ),
    "patch with a trailing newline": (
        lambda c: set_key(c, ["variants", 1, "patch"], "envs/patches/x.patch\n"),
        "variants[1].patch: 'envs/patches/x.patch\\n' does not match",
    ),
    "model id that leaves resources/models": (
        lambda c: set_key(c, ["sglang"], {"model": "../../etc"}),
        "sglang.model: '../../etc' does not match",
    ),
    "model revision with a trailing newline": (
        lambda c: set_key(c, ["sglang"], {"model_revision": "a" * 40 + "\n"}),
        f"sglang.model_revision: '{'a' * 40}\\n' does not match",
    ),
    "model path that is an option": (
        lambda c: set_key(c, ["sglang"], {"model_path": "--host=0.0.0.0"}),
        "sglang.model_path: '--host=0.0.0.0' does not match",
    ),
    "served model name that is an option": (
        lambda c: set_key(c, ["sglang"], {"served_model_name": "--port=1"}),
        "sglang.served_model_name: '--port=1' does not match",
    ),
    "base image that is a docker option": (
        lambda c: set_key(
            c, ["sglang"], {"base_image": "--privileged@sha256:" + "a" * 64}
        ),
        "sglang.base_image: '--privileged@sha256:",
    ),
    "embedded base image that is a docker option": (
        lambda c: set_key(c, ["container"], {"embedded_base_image": "--pull=always"}),
        "container.embedded_base_image: '--pull=always' does not match",
    ),
    "GPUs with a trailing newline": (
        lambda c: set_key(c, ["container"], {"gpus": "all\n"}),
        "container.gpus: 'all\\n' does not match",
    ),
    "bisect repository that is a git option": (
        lambda c: set_key(
            c,
            ["bisect"],
            {"repository": "--upload-pack=x", "good": "v1", "bad": "v2", "arm": "A"},
        ),
        "bisect.repository: '--upload-pack=x' does not match",
    ),
    "bisect revision with a trailing newline": (
        lambda c: set_key(
            c, ["bisect"], {"repository": "r", "good": "v1", "bad": "v2\n", "arm": "A"}
        ),
        "bisect.bad: 'v2\\n' does not match",
    ),
    "server argument abbreviating --host": (
        lambda c: set_key(c, ["sglang"], {"extra_server_args": ["--hos=0.0.0.0"]}),
        "sglang.extra_server_args[0]: '--hos=0.0.0.0' sets --host, which comes from "
        "the runner",
    ),
    "arm server argument reading a file of arguments": (
        lambda c: set_key(c, ["arms", 2, "server_args"], ["--port", "1", "--conf=x"]),
        "arms[2].server_args[2]: '--conf=x' sets --config, which makes SGLang read",
    ),
    "host lock that neither waits nor fails": (
        lambda c: set_key(c, ["host_sharing"], {"lock": "steal"}),
        "host_sharing.lock: 'steal' is not one of ['wait', 'fail']",
    ),
    "host lock file that is not a .lock file": (
        lambda c: set_key(c, ["host_sharing"], {"lock_file": "/etc/passwd"}),
        "host_sharing.lock_file: '/etc/passwd' does not match",
    ),
    "negative bound on other load": (
        lambda c: set_key(c, ["host_sharing"], {"max_other_load_cores": -1}),
        "host_sharing.max_other_load_cores: -1 is less than the minimum of 0",
    ),
}


def test_a_server_argument_the_platform_sets_is_refused_before_any_job():
    """On the host-torch platform SGLang's Triton attention stands in for
    sgl-kernel's: an arm that asks for another backend fails the config check."""
    config = yaml.safe_load((ROOT / "config" / "gpu-host-real.yaml").read_text())
    config["arms"][0]["server_args"] = ["--attention-backend", "fa3"]
    with pytest.raises(ConfigError) as raised:
        check(config)
    assert (
        "bad.yaml: arms[0].server_args[0]: '--attention-backend' sets "
        "--attention-backend, which the platform for sglang.device cuda with "
        "sglang.torch host sets (config/platform.py)"
    ) in str(raised.value)


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_is_named_in_one_line(case):
    break_config, expected = BAD_CONFIGS[case]
    config = default_config()
    break_config(config)
    with pytest.raises(ConfigError) as raised:
        check(config)
    message = str(raised.value)
    assert expected in message
    assert message.startswith("bad.yaml: ")
    assert expected in message.splitlines()[0] or any(
        line.startswith("bad.yaml: ") and expected in line
        for line in message.splitlines()
    )


def schema_patterns(node) -> list[str]:
    """Every ``pattern`` of the schema, in nested records and lists alike."""
    if isinstance(node, list):
        return [pattern for item in node for pattern in schema_patterns(item)]
    if not isinstance(node, dict):
        return []
    own = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
    return own + [p for value in node.values() for p in schema_patterns(value)]


def test_no_schema_pattern_lets_a_trailing_newline_through():
    """jsonschema applies a pattern with re.search, where $ also matches before a
    final newline: every $ of a pattern is followed by (?!\\n)."""
    patterns = schema_patterns(yaml.safe_load(SCHEMA.read_text()))
    unguarded = re.compile(r"(?<!\\)\$(?!\(\?!\\n\))")
    assert [p for p in patterns if unguarded.search(p)] == []
    assert "^[A-Za-z0-9][A-Za-z0-9_.-]*$(?!\\n)" in patterns  # names


def test_jpeg_quality_100_passes_the_check():
    config = default_config()
    config["workloads"][0]["jpeg_quality"] = 100
    assert check(config)["workloads"][0]["jpeg_quality"] == 100


def test_defaults_are_filled_from_the_schema():
    config = check(default_config())
    assert config["client"]["warmup_requests"] == 16
    assert config["arms"][0]["transport"] == "cpu"
    assert config["arms"][0]["runs"] == 3
    assert config["arms"][0]["environment"] == {}
    assert config["monitors"]["sample_hz"] == 10
    assert config["host_sharing"]["lock"] == "wait"
    assert config["host_sharing"]["max_other_load_cores"] == 0.5


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_is_valid(name):
    config = yaml.safe_load((ROOT / name).read_text())
    check_config(copy.deepcopy(config), SCHEMA, [name], ROOT)


def test_snakemake_refuses_a_bad_config_before_any_job(tmp_path):
    config = default_config()
    config["arms"][2]["cpu_quota"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    refused = snakemake_refuses(bad)
    assert f"{bad}: arms[2].cpu_quota: 0 is not a CPU quota" in refused


def test_the_old_quota_timing_key_still_works_with_a_warning():
    config = default_config()
    config["client"]["quota_during_startup"] = True
    config["arms"][1]["quota_timing"] = "healthy"
    with pytest.warns(FutureWarning, match="quota_during_startup is deprecated"):
        checked = check(config)
    assert "quota_during_startup" not in checked["client"]
    timings = [arm["quota_timing"] for arm in checked["arms"]]
    assert timings[0] == "start" and timings[1] == "healthy"
    assert set(timings[2:]) == {"start"}


def test_without_the_old_key_the_quota_comes_once_healthy():
    checked = check(default_config())
    assert {arm["quota_timing"] for arm in checked["arms"]} == {"healthy"}
