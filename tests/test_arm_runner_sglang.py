"""The runner starts a real SGLang arm with the published configs' settings.

No GPU here: these tests check what would run (the server argv, its container,
environment, model mount and the client's model name), built exactly as the runner
builds them for ``engine: sglang``.
"""

from pathlib import Path

import yaml

from serving_study.config.platform import PROJECT_ROOT
from serving_study.config.records import Arm, ClientSettings, ServerSettings, Variant
from serving_study.config.validation import check_config
from serving_study.measure.arm_server import model_name, server_argv
from serving_study.measure.run_outputs import RunPaths
from serving_study.measure.server_start import new_server
from serving_study.workloads import generate_workload

ROOT = Path(__file__).resolve().parents[1]


def published(name: str) -> dict:
    config = yaml.safe_load((ROOT / "config" / name).read_text())
    return check_config(
        config, ROOT / "config" / "schema" / "config.schema.yaml", [name], ROOT
    )


# A variant a real SGLang argv does not read (the image, or the runtime, has it).
UNREAD_VARIANT = Variant.from_identity(
    {"name": "v", "sglang_python_root": "/v/python", "mm_utils_sha256": "0" * 64}
)


def server_settings_of(config: dict, model_host_path: str, **files) -> ServerSettings:
    return ServerSettings.from_config(
        config, model_snapshot={"path": model_host_path}, **files
    )


def arm_named(config: dict, name: str) -> Arm:
    return Arm.from_config(next(arm for arm in config["arms"] if arm["name"] == name))


def test_every_b1_arm_runs_sglang_with_an_explicit_transport_in_its_image(tmp_path):
    config = published("b1.yaml")
    server_settings = server_settings_of(config, "/data/models/Qwen3-VL-4B-Instruct")
    for arm in map(Arm.from_config, config["arms"]):
        argv = server_argv(server_settings, UNREAD_VARIANT, arm, 31000)
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        transport = argv[argv.index("--mm-feature-transport") + 1]
        assert transport == arm.transport == "cpu"
        assert "--disable-radix-cache" in argv
        assert argv[argv.index("--port") + 1] == "31000"
        model_path = argv[argv.index("--model-path") + 1]
        assert model_path.startswith("/models/")


def test_the_container_gets_gpus_the_model_read_only_and_the_cache_settings(
    tmp_path,
):
    config = published("b1.yaml")
    arm = arm_named(config, "B")
    (tmp_path / "image.iid").write_text("sha256:" + "0" * 64)
    server_settings = server_settings_of(
        config,
        "/data/models/Qwen3-VL-4B-Instruct",
        image_id_file=tmp_path / "image.iid",
    )
    paths = RunPaths(*(tmp_path / name for name in "abcde"))
    spec = {"name": "w", "seed": 1, "images": 2, "width": 512, "height": 512}
    spec["input_tokens"] = 8
    generate_workload(spec, tmp_path / "workload")
    server = new_server(
        server_settings,
        server_argv(server_settings, UNREAD_VARIANT, arm, 31000),
        arm,
        "b1-B-run1",
        paths,
        ClientSettings.from_config(config["client"]),
        tmp_path / "workload" / "manifest.json",
    )
    run = server.run_argv
    assert "--privileged" not in run
    assert "--gpus" in run
    assert (
        "/data/models/Qwen3-VL-4B-Instruct:/models/Qwen--Qwen3-VL-4B-Instruct:ro" in run
    )
    assert "--env" in run and "OMP_NUM_THREADS=8" in run
    assert "SGLANG_VLM_CACHE_SIZE_MB=0" in run
    assert model_name(server_settings) == config["sglang"]["model"]


def test_a_cpu_arm_runs_the_built_runtime_with_the_variants_tree_first(tmp_path):
    config = published("sglang-cpu.yaml")
    server_settings = ServerSettings.from_config(
        config,
        model_snapshot={
            "path": str(tmp_path / "tiny"),
            "load_format": "dummy",
            "settings": {"dtype": "float32"},
        },
        runtime_python="/runtime/venv/bin/python",
    )
    variant = Variant.from_identity(
        {
            "name": "patched",
            "sglang_python_root": "/variants/patched/python",
            "mm_utils_sha256": "0" * 64,
            "patch": {
                "file": "envs/patches/pr48881-shm-copy-without-thread-fanout.patch"
            },
            "pull_request": None,
        }
    )
    arm = arm_named(config, "C-main")
    argv = server_argv(server_settings, variant, arm, 31000)
    assert argv[:3] == ["/runtime/venv/bin/python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--device") + 1] == "cpu"
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert argv[argv.index("--dtype") + 1] == "float32"
    paths = RunPaths(*(tmp_path / name for name in "abcde"))
    server = new_server(
        server_settings,
        argv,
        arm,
        "cpu-C-main-run1",
        paths,
        ClientSettings.from_config(config["client"]),
        None,
        variant,
    )
    path = server.environment["PYTHONPATH"].split(":")
    assert path[0] == "/variants/patched/python"
    assert path[1:] == [
        str(PROJECT_ROOT / "envs" / "server-probe"),
        str(PROJECT_ROOT / "envs" / "sglang-cpu" / "stand-in"),
    ]
    assert server.environment["SGLANG_USE_CPU_ENGINE"] == "1"
    assert server.environment["SERVING_STUDY_REPORT_MODULES"] == (
        "sglang.srt.managers.mm_utils"
    )
    assert server.quota_scope == "main_process" and server.terminate_leader_only
