"""Every real SGLang arm's launch plan: built from config as the study ran it, and
accepted by SGLang 0.5.23's own argument parser.

The parser runs in the real server's CPU runtime (built once per CI run for the
tests of the real server), with the release's source on its path. The argv lists
it checks are the plans' commands, for every arm of every GPU experiment, built by
the function the ``launch_plan`` rule calls (a GPU experiment's images and model
cannot be made on a host without a GPU; tests/test_workflow_sglang_cpu.py runs
the rule itself, and every run starts the plan it wrote).
"""

import argparse
import contextlib
import io
import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from serving_study.config.platform import (
    CPU_PLATFORM,
    PROJECT_ROOT,
    compile_cache,
    platform_for,
    python_path,
)
from serving_study.config.records import Arm, ServerSettings, Variant
from serving_study.config.server_arguments import (
    FLAGS_FROM_CONFIG,
    FLAGS_HIDING_ARGUMENTS,
    server_argument_conflicts,
)
from serving_study.config.validation import check_config
from serving_study.launch.engines import launch_plan
from serving_study.launch.plan import LaunchPlan
from serving_study.launch.sglang import ServerArgumentConflict
from serving_study.servers.container_commands import run_command

ROOT = Path(__file__).resolve().parents[1]
GPU_EXPERIMENTS = ("b1", "p4", "p5", "p6b")
# The study ran P4, P6b and B1 with the radix cache off, P5 (one repeated image,
# 283 of 284 tokens matched) with it on.
RADIX_CACHE_OFF = {"b1": True, "p4": True, "p5": False, "p6b": True}
THREAD_CAPPED_ARMS = {("b1", "B"), ("b1", "D"), ("p6b", "omp-8")}
MODEL_PATH = "/models/Qwen--Qwen3-VL-4B-Instruct"
IMAGE_ID = "sha256:" + "e" * 64
# The arms' variant as their plans read it: no patch, a tree of its own.
VARIANT = Variant.from_identity(
    {"name": "v", "sglang_python_root": "/v/python", "mm_utils_sha256": "0" * 64}
)

# Runs inside the parser's environment: {case: arguments} on stdin, {case: what
# SGLang resolved, or the parser's error} on stdout.
PARSE_PROGRAM = """
import contextlib, io, json, sys
from sglang.srt.server_args import prepare_server_args

FIELDS = ("model_path", "served_model_name", "host", "port", "mm_feature_transport",
          "disable_radix_cache", "mm_preprocess_cache_size_mb", "mem_fraction_static",
          "max_total_tokens", "max_running_requests", "attention_backend",
          "sampling_backend", "mm_attention_backend", "load_format", "dtype",
          "disable_prefill_cuda_graph", "disable_decode_cuda_graph")
answers = {}
for case, arguments in json.load(sys.stdin).items():
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(errors):
            parsed = prepare_server_args(arguments)
        answers[case] = {"resolved": {f: getattr(parsed, f) for f in FIELDS}}
    except SystemExit as exit:
        lines = errors.getvalue().strip().splitlines() or [f"exit {exit.code}"]
        answers[case] = {"error": lines[-1]}
json.dump(answers, sys.stdout)
"""


def experiment_config(name: str) -> dict:
    """A shipped experiment config, checked, with the schema's defaults filled in."""
    path = ROOT / "config" / f"{name}.yaml"
    config = yaml.safe_load(path.read_text())
    return check_config(
        config, ROOT / "config" / "schema" / "config.schema.yaml", [path], ROOT
    )


def every_arm() -> list:
    return [
        pytest.param(name, Arm.from_config(arm), id=f"{name}-{arm['name']}")
        for name in GPU_EXPERIMENTS
        for arm in experiment_config(name)["arms"]
    ]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> SimpleNamespace:
    """What a plan reads besides the config: the image id a build wrote, and a
    workload manifest."""
    directory = tmp_path_factory.mktemp("plan-files")
    (directory / "image.iid").write_text(IMAGE_ID)
    manifest = directory / "manifest.json"
    manifest.write_text(json.dumps({"images": [{"width": 512, "height": 512}]}))
    return SimpleNamespace(image=directory / "image.iid", manifest=manifest)


def plan_of(
    experiment: str,
    arm: Arm,
    files: SimpleNamespace,
    *,
    runtime: str = "docker",
    device: str = "cuda",
    model_path: str = "/data/qwen",
    tiny: bool = False,
    sglang: dict | None = None,
    port: int = 30000,
) -> LaunchPlan:
    """The arm's plan as the experiment's ``launch_plan`` job builds it, here with
    the given runtime, device, model snapshot and sglang settings."""
    config = experiment_config(experiment)
    settings = config["sglang"] | {"device": device} | (sglang or {})
    snapshot = {"path": model_path}
    if tiny:
        snapshot |= {"load_format": "dummy", "settings": {"dtype": "float32"}}
    server = ServerSettings.from_config(
        config | {"runtime": runtime, "sglang": settings},
        image_id_file=files.image,
        model_snapshot=snapshot,
        runtime_record={"python": "/runtime/venv/bin/python"},
    )
    return launch_plan(server, arm, VARIANT, files.manifest, port=port)


def first_arm(experiment: str, **fields) -> Arm:
    return Arm.from_config(experiment_config(experiment)["arms"][0] | fields)


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[index + 1] for index, item in enumerate(argv) if item == flag]


@pytest.mark.parametrize("experiment, arm", every_arm())
def test_every_arm_spells_out_transport_and_caches(experiment, arm, files):
    plan = plan_of(experiment, arm, files)
    argv = plan.command()

    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert flag_values(argv, "--mm-feature-transport") == [arm.transport]
    assert ("--disable-radix-cache" in argv) is RADIX_CACHE_OFF[experiment]
    assert flag_values(argv, "--mm-preprocess-cache-size-mb") == ["0"]
    assert flag_values(argv, "--model-path") == [MODEL_PATH]
    assert flag_values(argv, "--port") == ["30000"]
    assert flag_values(argv, "--host") == ["127.0.0.1"]
    assert flag_values(argv, "--served-model-name") == ["Qwen/Qwen3-VL-4B-Instruct"]
    assert plan.container.image == IMAGE_ID and plan.container.gpus == "device=0"
    assert plan.environment["HOME"] == "/tmp"  # the image's root is read-only


@pytest.mark.parametrize("experiment, arm", every_arm())
def test_every_arm_turns_the_environment_only_caches_off(experiment, arm, files):
    environment = plan_of(experiment, arm, files).environment

    assert environment["SGLANG_VLM_CACHE_SIZE_MB"] == "0"
    assert environment["SGLANG_MM_FEATURE_CACHE_MB"] == "1024"
    assert environment["HF_HUB_OFFLINE"] == "1"
    capped = (experiment, arm.name) in THREAD_CAPPED_ARMS
    assert environment.get("OMP_NUM_THREADS") == ("8" if capped else None)


def test_both_transports_are_explicit_even_where_sglang_would_choose(files):
    arms = map(Arm.from_config, experiment_config("p4")["arms"])
    transports = {
        arm.name: flag_values(plan_of("p4", arm, files).argv, "--mm-feature-transport")
        for arm in arms
    }
    assert transports["cpu-c16"] == ["cpu"]
    assert transports["ipc-c16"] == ["cuda_ipc"]


MEMORY_AND_EXTRA = {
    "mem_fraction_static": 0.8,
    "max_total_tokens": 200000,
    "served_model_name": "qwen3-vl",
    "extra_server_args": ["--cuda-graph-max-bs", "16"],
}


def test_memory_settings_then_extra_then_arm_arguments(files):
    arm = first_arm("p4", server_args=["--max-running-requests", "16"])
    plan = plan_of("p4", arm, files, sglang=MEMORY_AND_EXTRA)
    argv = list(plan.argv)

    assert flag_values(argv, "--mem-fraction-static") == ["0.8"]
    assert flag_values(argv, "--max-total-tokens") == ["200000"]
    assert flag_values(argv, "--served-model-name") == ["qwen3-vl"]
    assert plan.served_model_name == "qwen3-vl"
    assert argv[-4:] == ["--cuda-graph-max-bs", "16", "--max-running-requests", "16"]


@pytest.mark.parametrize(
    "extra, arm_arguments, named",
    [
        (["--mm-feature-transport", "cuda_ipc"], [], "arms[].transport"),
        ([], ["--disable-radix-cache"], "sglang.disable_radix_cache"),
        (["--port=31000"], [], "the runner"),
        ([], ["--mem-fraction-static", "0.5"], "sglang.mem_fraction_static"),
    ],
)
def test_extra_arguments_may_not_override_a_config_key(
    extra, arm_arguments, named, files
):
    arm = first_arm("p4", server_args=arm_arguments)
    with pytest.raises(ServerArgumentConflict, match=named.replace("[", r"\[")):
        plan_of("p4", arm, files, sglang={"extra_server_args": extra})


def test_extra_arguments_may_not_override_the_platforms_flags(files):
    """The CPU platform's attention backend is what its runs are described by: an
    extra argument setting it, in any spelling, is refused there, and passes on a
    GPU host with SGLang's own stack, whose platform sets no backend."""
    arm = first_arm("p4")
    extra = {"extra_server_args": ["--cuda-graph-max-bs", "16", "--attention-back=fa3"]}
    with pytest.raises(ServerArgumentConflict) as raised:
        plan_of("p4", arm, files, device="cpu", tiny=True, sglang=extra)
    assert str(raised.value).startswith(
        "sglang.extra_server_args[2]: '--attention-back=fa3' sets --attention-backend,"
        " which the platform for sglang.device cpu with sglang.torch pinned sets"
    )
    on_gpu = plan_of("p4", arm, files, sglang=extra)
    assert on_gpu.argv[-1] == "--attention-back=fa3"


# Spellings SGLang's parser (argparse, abbreviations allowed) takes for a flag
# that a config key sets, and the flag each one sets.
ABBREVIATED_FLAGS = [
    (["--host=0.0.0.0"], "--host"),
    (["--hos", "0.0.0.0"], "--host"),
    (["--ho=0.0.0.0"], "--host"),
    (["--model", "/elsewhere"], "--model"),
    (["--served-model=other"], "--served-model-name"),
    (["--mem-frac", "0.9"], "--mem-fraction-static"),
    (["--disable-radix"], "--disable-radix-cache"),
    (["--config", "more.yaml"], "--config"),
]


@pytest.mark.parametrize("arguments, flag", ABBREVIATED_FLAGS)
@pytest.mark.parametrize("where", ["extra_server_args", "server_args"])
def test_every_spelling_of_a_flag_from_config_is_refused(arguments, flag, where, files):
    arm, extra = first_arm("p4"), {}
    given = ["--cuda-graph-max-bs", "16", *arguments]
    if where == "extra_server_args":
        extra = {"extra_server_args": given}
        named = "sglang.extra_server_args[2]"
    else:
        arm = first_arm("p4", server_args=given)
        named = f"arms[{arm.name}].server_args[2]"

    with pytest.raises(ServerArgumentConflict) as raised:
        plan_of("p4", arm, files, sglang=extra)

    message = str(raised.value)
    assert message.startswith(f"{named}: {arguments[0]!r} sets {flag}, which ")
    assert "\n" not in message


def test_what_argparse_reads_as_a_flag_from_config_is_refused():
    """Python's argparse, which SGLang's parser is, holding only the refused flags:
    a prefix unique among them may be ambiguous among SGLang's flags, never the
    other way round, so these are all the spellings SGLang can take."""
    refused = [*FLAGS_FROM_CONFIG, *FLAGS_HIDING_ARGUMENTS]
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    for flag in refused:
        parser.add_argument(flag, dest=flag)
    taken = {flag: set() for flag in refused}
    for flag in refused:
        for end in range(3, len(flag) + 1):
            for arguments in ([flag[:end], "x"], [f"{flag[:end]}=x"]):
                try:
                    with contextlib.redirect_stderr(io.StringIO()):
                        parsed = vars(parser.parse_args(arguments))
                except (argparse.ArgumentError, SystemExit):
                    continue  # ambiguous among the refused flags
                (set_flag,) = [name for name, value in parsed.items() if value == "x"]
                taken[set_flag].add(arguments[0])
                assert server_argument_conflicts(arguments, "extra"), arguments
    assert {"--ho", "--hos", "--host", "--hos=x", "--host=x"} <= taken["--host"]
    assert "--conf=x" in taken["--config"]


def test_arguments_that_set_no_flag_from_config_pass():
    arguments = ["--max-running-requests", "16", "--chunked-prefill-size", "8192"]
    arguments += ["--hostname-override", "-h", "--", "--mem-fraction-static-x"]
    assert server_argument_conflicts(arguments, "sglang.extra_server_args") == []


def test_the_quota_is_in_the_container_argv_only_when_given_at_start(files):
    arm = experiment_config("b1")["arms"][1]
    run = {
        timing: run_command(
            plan_of("b1", Arm.from_config(arm | {"quota_timing": timing}), files),
            "n",
            "n",
        )
        for timing in ("start", "healthy")
    }
    assert flag_values(run["start"], "--cpus") == ["13.6"]
    assert "--cpus" not in run["healthy"]
    assert "OMP_NUM_THREADS=8" in flag_values(run["start"], "--env")


def test_a_hugging_face_cache_snapshot_is_mounted_with_its_blobs(files):
    cache = "/data/hf/hub/models--Qwen--Qwen3-VL-4B-Instruct"
    snapshot = f"{cache}/snapshots/{'a' * 40}"
    plan = plan_of("p4", first_arm("p4"), files, model_path=snapshot)
    assert plan.container.read_only_mounts[0] == (cache, MODEL_PATH)
    assert flag_values(run_command(plan, "n", "n"), "--volume")[0] == (
        f"{cache}:{MODEL_PATH}:ro"
    )
    assert flag_values(plan.argv, "--model-path") == [
        f"{MODEL_PATH}/snapshots/{'a' * 40}"
    ]


def test_a_local_server_loads_the_model_from_its_host_path(files):
    plan = plan_of("p6b", first_arm("p6b"), files, runtime="local")
    assert plan.container is None
    assert flag_values(plan.argv, "--model-path") == ["/data/qwen"]


# --- SGLang's own parser -------------------------------------------------------------


@pytest.fixture(scope="session")
def sglang_parser(sglang_cpu_runtime, sglang_0_5_23) -> tuple[str, dict]:
    """A Python where SGLang 0.5.23's own parser imports: the real server's CPU
    runtime (built once per CI run for the tests of the real server), with the
    release's source and the sgl-kernel stand-in on its path, as a server has them."""
    tree, _ = sglang_0_5_23
    path = python_path(CPU_PLATFORM, str(tree / "python"))
    return sglang_cpu_runtime["python"], dict(os.environ, PYTHONPATH=path)


def sglang_parses(parser: tuple[str, dict], cases: dict) -> dict[str, dict]:
    python, environment = parser
    finished = subprocess.run(
        [python, "-c", PARSE_PROGRAM],
        input=json.dumps(cases),
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return json.loads(finished.stdout)


def server_arguments(server_argv: list[str]) -> list[str]:
    assert server_argv[1:3] == ["-m", "sglang.launch_server"]
    return server_argv[3:]


def every_arms_plan(files) -> dict[str, LaunchPlan]:
    return {
        f"{experiment}/{arm.name}": plan_of(experiment, arm, files)
        for experiment in GPU_EXPERIMENTS
        for arm in map(Arm.from_config, experiment_config(experiment)["arms"])
    }


def memory_and_extra_arguments(files) -> list[str]:
    settings = {
        "mem_fraction_static": 0.75,
        "max_total_tokens": 150000,
        "extra_server_args": ["--max-running-requests", "32"],
    }
    arm = Arm.from_config(experiment_config("p5")["arms"][1])
    return plan_of("p5", arm, files, sglang=settings, port=30001).command()


# What SGLang lacks must fail, as it would on a GPU host.
UNKNOWN_TO_SGLANG = {
    "unknown transport": ["--model-path", MODEL_PATH, "--mm-feature-transport", "shm"],
    "unknown flag": ["--model-path", MODEL_PATH, "--mm-feature-transport-pool", "1"],
}


@pytest.fixture(scope="module")
def sglang_answers(files, sglang_parser) -> dict[str, dict]:
    """SGLang's parser on every arm's plan and the cases below, in one process
    (importing SGLang takes seconds)."""
    cases = {
        case: server_arguments(plan.command())
        for case, plan in every_arms_plan(files).items()
    }
    cases["memory and extra"] = server_arguments(memory_and_extra_arguments(files))
    cases |= {
        f"host torch/{name}": server_arguments(plan.command())
        for name, plan in host_torch_plans(files).items()
    }
    cases |= UNKNOWN_TO_SGLANG
    answers = sglang_parses(sglang_parser, cases)
    assert set(answers) == set(cases)
    return answers


def test_sglang_0_5_23_accepts_every_arm_as_configured(files, sglang_answers):
    for case, plan in every_arms_plan(files).items():
        experiment = case.split("/")[0]
        answer = sglang_answers[case]
        assert "error" not in answer, f"{case}: {answer.get('error')}"
        resolved = answer["resolved"]
        assert resolved["mm_feature_transport"] == plan.expected.transport, case
        assert resolved["disable_radix_cache"] is RADIX_CACHE_OFF[experiment], case
        assert resolved["mm_preprocess_cache_size_mb"] == 0, case
        assert resolved["model_path"] == MODEL_PATH, case
        assert resolved["served_model_name"] == "Qwen/Qwen3-VL-4B-Instruct", case
        assert (resolved["host"], resolved["port"]) == ("127.0.0.1", 30000), case


MEMORY_AND_EXTRA_RESOLVED = (
    "model_path",
    "served_model_name",
    "host",
    "port",
    "mm_feature_transport",
    "disable_radix_cache",
    "mm_preprocess_cache_size_mb",
    "mem_fraction_static",
    "max_total_tokens",
    "max_running_requests",
)


def host_torch_plans(files) -> dict[str, LaunchPlan]:
    """config/gpu-host-real.yaml's plans, with the 4B-shaped model's dummy load."""
    config = experiment_config("gpu-host-real")
    snapshot = {
        "path": MODEL_PATH,
        "load_format": "dummy",
        "settings": config["sglang"]["tiny_model"],
    }
    server = ServerSettings.from_config(
        config,
        model_snapshot=snapshot,
        runtime_record={"python": "/usr/bin/python3", "site": "/runtime/site"},
    )
    return {
        arm["name"]: launch_plan(server, Arm.from_config(arm), VARIANT, files.manifest)
        for arm in config["arms"]
    }


def test_sglang_0_5_23_accepts_the_host_torch_platforms_fallbacks(
    files, sglang_answers
):
    """Every flag the platform adds is one SGLang 0.5.23 knows, and resolves as
    the platform means it (the stand-ins need these fallbacks)."""
    for name, plan in host_torch_plans(files).items():
        answer = sglang_answers[f"host torch/{name}"]
        assert "error" not in answer, f"{name}: {answer.get('error')}"
        resolved = answer["resolved"]
        assert resolved["mm_feature_transport"] == plan.expected.transport, name
        assert (
            resolved["attention_backend"],
            resolved["sampling_backend"],
            resolved["mm_attention_backend"],
        ) == ("triton", "pytorch", "sdpa"), name
        assert resolved["disable_prefill_cuda_graph"] is True, name
        assert resolved["disable_decode_cuda_graph"] is True, name
        assert (resolved["load_format"], resolved["dtype"]) == ("dummy", "bfloat16")
        assert resolved["max_total_tokens"] == 131072, name


def test_sglang_0_5_23_parses_memory_and_extra_arguments(sglang_answers):
    answer = sglang_answers["memory and extra"]
    assert "error" not in answer, answer
    resolved = answer["resolved"]
    assert {key: resolved[key] for key in MEMORY_AND_EXTRA_RESOLVED} == {
        "model_path": MODEL_PATH,
        "served_model_name": "Qwen/Qwen3-VL-4B-Instruct",
        "host": "127.0.0.1",
        "port": 30001,
        "mm_feature_transport": "cuda_ipc",
        "disable_radix_cache": False,
        "mm_preprocess_cache_size_mb": 0,
        "mem_fraction_static": 0.75,
        "max_total_tokens": 150000,
        "max_running_requests": 32,
    }


def test_sglang_0_5_23_refuses_what_it_does_not_know(sglang_answers):
    """The check is SGLang's own: it is not a list of flags we keep."""
    assert "invalid choice: 'shm'" in sglang_answers["unknown transport"]["error"]
    assert "unrecognized arguments" in sglang_answers["unknown flag"]["error"]


# Runs inside the parser's environment: SGLang's option strings with their dests,
# and the host each list of arguments (on stdin) sets, None where SGLang refuses it.
OPTIONS_PROGRAM = """
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs

parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
hosts = {}
for arguments in json.load(sys.stdin):
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed = parser.parse_args(["--model-path", "/m", *arguments])
        hosts[" ".join(arguments)] = parsed.host
    except SystemExit:
        hosts[" ".join(arguments)] = None
actions = parser._option_string_actions
options = {option: action.dest for option, action in actions.items()}
json.dump({"options": options, "hosts": hosts}, sys.stdout)
"""


def test_sglang_0_5_23_takes_abbreviated_flags_and_the_guard_knows_its_options(
    sglang_parser,
):
    cases = [["--host=0.0.0.0"], ["--hos", "0.0.0.0"], ["--ho=0.0.0.0"], ["--h=1"]]
    python, environment = sglang_parser
    finished = subprocess.run(
        [python, "-c", OPTIONS_PROGRAM],
        input=json.dumps(cases),
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    answers = json.loads(finished.stdout)

    # The threat is real: SGLang binds where an abbreviation says ("--h" is
    # ambiguous there, and refused).
    assert answers["hosts"] == {
        "--host=0.0.0.0": "0.0.0.0",
        "--hos 0.0.0.0": "0.0.0.0",
        "--ho=0.0.0.0": "0.0.0.0",
        "--h=1": None,
    }
    options = answers["options"]
    refused = {options[flag] for flag in [*FLAGS_FROM_CONFIG, *FLAGS_HIDING_ARGUMENTS]}
    # Every option string of those settings (aliases too) is refused, and none
    # of SGLang's other options is.
    wrong = [
        option
        for option, dest in options.items()
        if bool(server_argument_conflicts([option], "extra")) != (dest in refused)
    ]
    assert wrong == []


# --- one code path for CPU and GPU hosts ------------------------------------------


def test_a_cpu_host_gets_the_cpu_engine_flags_and_dummy_weights_only_there(files):
    arm = first_arm("p4")
    on_gpu = plan_of("p4", arm, files)
    on_cpu = plan_of("p4", arm, files, device="cpu", tiny=True)

    assert flag_values(on_cpu.argv, "--device") == ["cpu"]
    assert flag_values(on_cpu.argv, "--attention-backend") == ["torch_native"]
    assert "--sleep-on-idle" in on_cpu.argv and "--disable-cuda-graph" in on_cpu.argv
    assert flag_values(on_cpu.argv, "--load-format") == ["dummy"]
    assert flag_values(on_cpu.argv, "--dtype") == ["float32"]
    assert "--device" not in on_gpu.argv and "--load-format" not in on_gpu.argv
    # Everything the config sets is the same on both.
    for flag in ("--mm-feature-transport", "--model-path", "--served-model-name"):
        assert flag_values(on_cpu.argv, flag) == flag_values(on_gpu.argv, flag)
    assert on_cpu.environment["SGLANG_USE_CPU_ENGINE"] == "1"
    assert "SGLANG_USE_CPU_ENGINE" not in on_gpu.environment


def test_a_cpu_container_gets_no_gpus_and_the_variants_image(files):
    plan = plan_of("b1", first_arm("b1"), files, device="cpu", tiny=True)
    assert plan.container.gpus is None
    assert "--gpus" not in run_command(plan, "n", "n")
    assert plan.container.image == IMAGE_ID


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_server_of_one_kind_and_image_shares_one_compile_cache(device, files):
    """Each arm's server is told the same inductor cache: a directory of this
    project on the host, one per image for containers (a variant's kernels never
    reach another's), mounted writable at one path inside every container."""
    platform = platform_for(device)
    plans = {
        (runtime, arm.name): plan_of("b1", arm, files, runtime=runtime, device=device)
        for runtime in ("local", "docker")
        for arm in map(Arm.from_config, experiment_config("b1")["arms"])
    }
    local_cache, _ = compile_cache(platform, in_container=False)
    container_cache, inside = compile_cache(platform, in_container=True)
    assert local_cache != container_cache
    assert local_cache.parent == PROJECT_ROOT / "resources" / "compile-cache"
    for (runtime, _), plan in plans.items():
        told = plan.environment["TORCHINDUCTOR_CACHE_DIR"]
        if runtime == "local":
            assert told == str(local_cache)
        else:
            assert told == inside
            volumes = flag_values(run_command(plan, "n", "n"), "--volume")
            per_image = container_cache / IMAGE_ID.removeprefix("sha256:")[:16]
            assert f"{per_image}:{inside}:rw" in volumes


@pytest.mark.parametrize("flag", ["--device", "--load-format=dummy"])
def test_the_platform_flags_cannot_be_overridden(flag, files):
    with pytest.raises(ServerArgumentConflict):
        plan_of(
            "p4",
            first_arm("p4"),
            files,
            device="cpu",
            sglang={"extra_server_args": [flag]},
        )
