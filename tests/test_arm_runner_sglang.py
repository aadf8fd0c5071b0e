"""A real SGLang arm's launch plan, from the published configs' settings.

No GPU here: these tests check what would run (the server argv, its container,
environment, model mount and the client's model name), built by the plan every
run starts as it is (launch/engines.py), and what the runtimes make of it.
"""

import json
from pathlib import Path

import yaml

from serving_study.config.platform import PROJECT_ROOT
from serving_study.config.records import Arm, ServerSettings, Variant
from serving_study.config.validation import check_config
from serving_study.launch.engines import launch_plan
from serving_study.launch.plan import LaunchPlan
from serving_study.measure.run_outputs import RunPaths
from serving_study.measure.server_start import new_server
from serving_study.workloads import generate_workload

ROOT = Path(__file__).resolve().parents[1]
IMAGE_ID = "sha256:" + "0" * 64


def published(name: str) -> dict:
    config = yaml.safe_load((ROOT / "config" / name).read_text())
    return check_config(
        config, ROOT / "config" / "schema" / "config.schema.yaml", [name], ROOT
    )


# A variant of no patch, whose tree a container's server does not read (its image
# has it).
UNREAD_VARIANT = Variant.from_identity(
    {"name": "v", "sglang_python_root": "/v/python", "mm_utils_sha256": "0" * 64}
)


def workload(directory: Path) -> Path:
    spec = {"name": "w", "seed": 1, "images": 2, "width": 512, "height": 512}
    generate_workload(spec | {"input_tokens": 8}, directory / "workload")
    return directory / "workload" / "manifest.json"


def b1_plans(tmp_path: Path) -> dict[str, LaunchPlan]:
    config = published("b1.yaml")
    (tmp_path / "image.iid").write_text(IMAGE_ID)
    server = ServerSettings.from_config(
        config,
        model_snapshot={"path": "/data/models/Qwen3-VL-4B-Instruct"},
        image_id_file=tmp_path / "image.iid",
    )
    manifest = workload(tmp_path)
    return {
        arm["name"]: launch_plan(
            server, Arm.from_config(arm), UNREAD_VARIANT, manifest, port=31000
        )
        for arm in config["arms"]
    }


def test_every_b1_arm_runs_sglang_with_an_explicit_transport_in_its_image(tmp_path):
    for plan in b1_plans(tmp_path).values():
        argv = plan.command()
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        transport = argv[argv.index("--mm-feature-transport") + 1]
        assert transport == plan.expected.transport == "cpu"
        assert "--disable-radix-cache" in argv
        assert argv[-2:] == ["--port", "31000"]
        model_path = argv[argv.index("--model-path") + 1]
        assert model_path.startswith("/models/")
        assert plan.container.image == IMAGE_ID and plan.working_directory is None
        assert plan.quota.cores == 13.6 and plan.quota.timing == "healthy"
        assert plan.served_model_name == "Qwen/Qwen3-VL-4B-Instruct"
        assert LaunchPlan.from_record(json.loads(json.dumps(plan.record()))) == plan


def test_the_container_gets_gpus_the_model_read_only_and_the_cache_settings(
    tmp_path,
):
    plan = b1_plans(tmp_path)["B"]
    paths = RunPaths(*(tmp_path / name for name in "abcde"))
    run = new_server(plan, "b1-B-run1", paths).runtime_argv
    assert "--privileged" not in run
    assert run[run.index("--gpus") + 1] == "device=0"  # one GPU, named
    assert "--read-only" in run and run[run.index("--pids-limit") + 1] == "4096"
    assert (
        "/data/models/Qwen3-VL-4B-Instruct:/models/Qwen--Qwen3-VL-4B-Instruct:ro" in run
    )
    assert "--env" in run and "OMP_NUM_THREADS=8" in run
    assert "SGLANG_VLM_CACHE_SIZE_MB=0" in run
    # No /dev/shm of the host: a private one, sized for the workload's load.
    assert "--ipc=host" not in run and run[run.index("--shm-size") + 1] == "1024m"
    assert run[-len(plan.command()) - 2 :] == ["--", IMAGE_ID, *plan.command()]


def test_a_cpu_arm_runs_the_built_runtime_with_the_variants_tree_first(tmp_path):
    config = published("sglang-cpu.yaml")
    server_settings = ServerSettings.from_config(
        config,
        model_snapshot={
            "path": str(tmp_path / "tiny"),
            "load_format": "dummy",
            "settings": {"dtype": "float32"},
        },
        runtime_record={"python": "/runtime/venv/bin/python"},
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
    arm = Arm.from_config(
        next(arm for arm in config["arms"] if arm["name"] == "C-main")
    )
    plan = launch_plan(server_settings, arm, variant, workload(tmp_path))
    argv = plan.argv
    assert argv[:3] == ("/runtime/venv/bin/python", "-m", "sglang.launch_server")
    assert argv[argv.index("--device") + 1] == "cpu"
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert argv[argv.index("--dtype") + 1] == "float32"
    path = plan.environment["PYTHONPATH"].split(":")
    assert path[0] == "/variants/patched/python"
    assert path[1:] == [
        str(PROJECT_ROOT / "envs" / "server-probe"),
        str(PROJECT_ROOT / "envs" / "sglang-cpu" / "stand-in"),
    ]
    assert plan.environment["SGLANG_USE_CPU_ENGINE"] == "1"
    assert plan.environment["SERVING_STUDY_REPORT_MODULES"] == (
        "sglang.srt.managers.mm_utils"
    )
    assert plan.expected.patched_modules == ("sglang.srt.managers.mm_utils",)
    assert plan.quota.scope == "main_process" and plan.stop_leader_only
    assert plan.stop_signal == "SIGINT" and plan.container is None
    assert plan.working_directory == str(PROJECT_ROOT)
