"""The runner starts a real SGLang arm with the published configs' settings.

No GPU here: these tests check what would run (the server argv, its container,
environment, model mount and the client's model name), built exactly as the runner
builds them for ``engine: sglang``.
"""

from pathlib import Path

import yaml

from serving_study.config.platform import PROJECT_ROOT
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


def engine_of(config: dict, model_host_path: str) -> dict:
    return {
        "engine": config["engine"],
        "runtime": config["runtime"],
        "embedded": config["embedded_engine"],
        "sglang": config["sglang"],
        "sglang_device": config["sglang"]["device"],
        "container": config["container"],
        "image_id_file": None,
        "model_host_path": model_host_path,
    }


def test_every_b1_arm_runs_sglang_with_an_explicit_transport_in_its_image(tmp_path):
    config = published("b1.yaml")
    engine = engine_of(config, "/data/models/Qwen3-VL-4B-Instruct")
    for arm in config["arms"]:
        argv = server_argv(engine, {}, arm, 31000)
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        transport = argv[argv.index("--mm-feature-transport") + 1]
        assert transport == arm["transport"] == "cpu"
        assert "--disable-radix-cache" in argv
        assert argv[argv.index("--port") + 1] == "31000"
        model_path = argv[argv.index("--model-path") + 1]
        assert model_path.startswith("/models/")


def test_the_container_gets_gpus_the_model_read_only_and_the_cache_settings(
    tmp_path,
):
    config = published("b1.yaml")
    engine = engine_of(config, "/data/models/Qwen3-VL-4B-Instruct")
    arm = next(arm for arm in config["arms"] if arm["name"] == "B")
    (tmp_path / "image.iid").write_text("sha256:" + "0" * 64)
    engine["image_id_file"] = str(tmp_path / "image.iid")
    paths = RunPaths(*(tmp_path / name for name in "abcde"))
    spec = {"name": "w", "seed": 1, "images": 2, "width": 512, "height": 512}
    spec["input_tokens"] = 8
    generate_workload(spec, tmp_path / "workload")
    server = new_server(
        engine,
        server_argv(engine, {}, arm, 31000),
        arm,
        "b1-B-run1",
        paths,
        config["client"],
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
    assert model_name(engine) == config["sglang"]["model"]


def test_a_cpu_arm_runs_the_built_runtime_with_the_variants_tree_first(tmp_path):
    config = published("sglang-cpu.yaml")
    engine = engine_of(config, str(tmp_path / "tiny"))
    engine["runtime_python"] = "/runtime/venv/bin/python"
    engine["model_flags"] = ("--load-format", "dummy", "--dtype", "float32")
    variant = {
        "name": "patched",
        "sglang_python_root": "/variants/patched/python",
        "patch": {"file": "envs/patches/pr48881-shm-copy-without-thread-fanout.patch"},
        "pull_request": None,
    }
    arm = next(arm for arm in config["arms"] if arm["name"] == "C-main")
    argv = server_argv(engine, variant, arm, 31000)
    assert argv[:3] == ["/runtime/venv/bin/python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--device") + 1] == "cpu"
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert argv[argv.index("--dtype") + 1] == "float32"
    paths = RunPaths(*(tmp_path / name for name in "abcde"))
    server = new_server(
        engine, argv, arm, "cpu-C-main-run1", paths, config["client"], None, variant
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
