"""The real server with a GPU host's own torch (config/gpu-host-real.yaml), on CPU.

Nothing here needs a GPU. Each arm's launch plan is the one the workflow's
``launch_plan`` job builds (the platform's flags, environment and path, the
4B-shaped model's dummy load, the runtime's Python); the CUDA stand-ins refuse
every call in the log line the runner reads, and (slow) SGLang 0.5.23's CUDA
import chain binds them under a torch that answers as an H200; the runtime
installs a hashed lock beside a Python from wheels put there beforehand, and
refuses a wheel whose sha256 is not the lock's.
"""

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from serving_study.config.platform import (
    GPU_STAND_IN_DIRECTORY,
    HOST_TORCH_PLATFORM,
    PROJECT_ROOT,
    python_path,
)
from serving_study.config.records import Arm, ServerSettings, Variant
from serving_study.config.validation import check_config
from serving_study.launch.engines import launch_plan
from serving_study.measure.server_log_facts import stand_in_calls
from serving_study.sources.host_torch_runtime import (
    ensure_host_torch_runtime,
    missing_wheels,
)
from serving_study.sources.recorded_files import RecordedFileChanged
from serving_study.sources.sglang_runtime import RuntimeBuildError

CONFIG = PROJECT_ROOT / "config" / "gpu-host-real.yaml"
STAND_INS = PROJECT_ROOT / GPU_STAND_IN_DIRECTORY
RUNTIME = {"python": "/usr/bin/python3", "site": "/runtime/site"}
VARIANT = Variant.from_identity(
    {"name": "v", "sglang_python_root": "/v/python", "mm_utils_sha256": "0" * 64}
)


@pytest.fixture(scope="module")
def config() -> dict:
    raw = yaml.safe_load(CONFIG.read_text())
    schema = PROJECT_ROOT / "config" / "schema" / "config.schema.yaml"
    return check_config(raw, schema, [str(CONFIG)], PROJECT_ROOT)


@pytest.fixture(scope="module")
def plans(config, tmp_path_factory) -> dict:
    """Every arm's plan as its launch_plan job writes it on the GPU host."""
    manifest = tmp_path_factory.mktemp("plans") / "manifest.json"
    manifest.write_text(json.dumps({"images": [{"width": 512, "height": 512}]}))
    snapshot = {
        "path": "/resources/tiny-models/qwen3-vl-4b-shape/model",
        "load_format": "dummy",
        "settings": config["sglang"]["tiny_model"],
    }
    server = ServerSettings.from_config(
        config, model_snapshot=snapshot, runtime_record=RUNTIME
    )
    return {
        arm["name"]: launch_plan(server, Arm.from_config(arm), VARIANT, manifest)
        for arm in config["arms"]
    }


def values_of(argv, flag: str) -> list[str]:
    return [argv[index + 1] for index, item in enumerate(argv) if item == flag]


def test_the_config_runs_the_issues_design(config):
    """The B1 2x2, cuda_ipc and both fixes that need no code change, at least 3
    runs each, the main process alone under 1.7 cores, c16, 160 fresh 512 px
    JPEGs and one output token; a 4B-shaped model with the host's torch."""
    arms = {arm["name"]: arm for arm in config["arms"]}
    assert set(arms) == {"A", "B", "C", "D", "E", "A-passive", "A-spin0"}
    for arm in arms.values():
        assert arm["runs"] >= 3 and arm["cpu_quota"] == 1.7
        assert arm["quota_scope"] == "main_process"
        assert (arm["concurrency"], arm["requests"], arm["output_tokens"]) == (
            16,
            160,
            1,
        )
    assert arms["E"]["transport"] == "cuda_ipc"
    assert {arms[n]["variant"] for n in ("C", "D")} == {"patched"}
    assert arms["A-passive"]["environment"] == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert arms["A-spin0"]["environment"] == {"GOMP_SPINCOUNT": "0"}
    (workload,) = config["workloads"]
    assert (workload["width"], workload["format"], workload["content"]) == (
        512,
        "jpeg",
        "noise",
    )
    sglang = config["sglang"]
    assert (sglang["device"], sglang["torch"]) == ("cuda", "host")
    assert sglang["tiny_model"]["shape"] == "qwen3-vl-4b"
    assert sglang["vlm_cache_size_mb"] == 0 and sglang["max_total_tokens"] == 131072


def test_every_arm_runs_the_host_torch_platform_with_the_4b_models_dummy_load(plans):
    for name, plan in plans.items():
        argv = plan.command()
        assert argv[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"], name
        for flag, value in (
            ("--attention-backend", "triton"),
            ("--sampling-backend", "pytorch"),
            ("--mm-attention-backend", "sdpa"),
            ("--load-format", "dummy"),
            ("--dtype", "bfloat16"),
            ("--max-total-tokens", "131072"),
            ("--mem-fraction-static", "0.6"),
            ("--context-length", "8192"),
        ):
            assert values_of(argv, flag) == [value], (name, flag)
        assert {"--disable-prefill-cuda-graph", "--disable-decode-cuda-graph"} <= set(
            argv
        )
        assert "--device" not in argv and "--sleep-on-idle" not in argv
        environment = plan.environment
        assert environment["SGLANG_FORCE_FUSED_OP_BACKEND"] == "torch"
        assert environment["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] == "1"
        assert environment["SGLANG_VLM_CACHE_SIZE_MB"] == "0"
        assert environment["SGLANG_MM_FEATURE_CACHE_MB"] == "1024"
        assert "SGLANG_USE_CPU_ENGINE" not in environment
        assert plan.container is None and plan.quota.main_process_only


def test_the_transport_is_explicit_in_every_arm(plans):
    """SGLang 0.5.23 would switch Qwen3-VL to cuda_ipc on a Hopper GPU by itself."""
    transports = {
        name: values_of(plan.argv, "--mm-feature-transport")
        for name, plan in plans.items()
    }
    assert transports.pop("E") == ["cuda_ipc"]
    assert set(map(tuple, transports.values())) == {("cpu",)}


def test_the_servers_path_is_variant_probe_stand_ins_then_the_runtimes_site(plans):
    path = plans["A"].environment["PYTHONPATH"].split(os.pathsep)
    assert path == [
        "/v/python",
        str(PROJECT_ROOT / "envs/server-probe"),
        str(STAND_INS),
        "/runtime/site",
    ]
    assert path == python_path(HOST_TORCH_PLATFORM, "/v/python", "/runtime/site").split(
        os.pathsep
    )


def test_the_host_torch_is_for_a_local_cuda_server_only(config):
    schema = PROJECT_ROOT / "config" / "schema" / "config.schema.yaml"
    for change, named in (
        ({"sglang": config["sglang"] | {"device": "cpu"}}, "sglang.device: cuda"),
        ({"runtime": "docker"}, "runtime: local"),
    ):
        broken = json.loads(json.dumps(config)) | change
        with pytest.raises(ValueError, match=named):
            check_config(broken, schema, [str(CONFIG)], PROJECT_ROOT)


def test_the_4b_shape_fixes_its_own_sizes(config):
    schema = PROJECT_ROOT / "config" / "schema" / "config.schema.yaml"
    broken = json.loads(json.dumps(config))
    broken["sglang"]["tiny_model"]["text_layers"] = 4
    with pytest.raises(ValueError, match="tiny_model.text_layers: 4"):
        check_config(broken, schema, [str(CONFIG)], PROJECT_ROOT)


# --- the CUDA stand-ins ---------------------------------------------------------

STAND_IN_CALLS = """
import json, os
facts = {"pid": os.getpid()}
from sgl_kernel import rmsnorm, silu_and_mul
from sgl_kernel.utils import is_arch_support_pdl
from sgl_kernel.flash_attn import flash_attn_varlen_func
facts["pdl"] = is_arch_support_pdl()
try:
    from sgl_kernel.scalar_type import scalar_types
except ImportError:
    facts["scalar_type"] = "absent"
import cutlass, cutlass.cute as cute
from cutlass.cute.runtime import from_dlpack
@cute.jit
def kernel():
    return "kept"
facts["decorated"] = kernel()
for call in (lambda: rmsnorm(1), lambda: cute.arch.sync(), lambda: from_dlpack(1)):
    try:
        call()
    except NotImplementedError as error:
        facts.setdefault("refused", []).append(str(error).split(" is ")[0])
print(json.dumps(facts))
"""


def test_the_cuda_stand_ins_import_refuse_every_call_and_say_so():
    finished = subprocess.run(
        [sys.executable, "-c", STAND_IN_CALLS],
        env=dict(os.environ, PYTHONPATH=str(STAND_INS)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 0, finished.stderr
    facts = json.loads(finished.stdout)
    assert facts["pdl"] is False and facts["scalar_type"] == "absent"
    assert facts["decorated"] == "kept"
    refused = ["sgl_kernel.rmsnorm", "cutlass.cute.arch.sync"]
    refused.append("cutlass.cute.runtime.from_dlpack")
    assert facts["refused"] == refused
    # As the runner reads the server log: each refusal a placeholder (which makes
    # the run invalid), the one real answer not.
    calls = stand_in_calls(finished.stderr)
    assert [(call.op, call.placeholder) for call in calls] == [
        ("sgl_kernel.utils.is_arch_support_pdl", False),
        *((name, True) for name in refused),
    ]
    assert {call.pid for call in calls} == {facts["pid"]}


# Run in the real server's CPU runtime with SGLang 0.5.23's tree: torch answers as
# an H200, so SGLang imports its CUDA path.
CUDA_IMPORT_CHAIN = """
import json, torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_capability = lambda *args, **kwargs: (9, 0)
torch.cuda.get_device_name = lambda *args, **kwargs: "NVIDIA H200"
from sglang.srt.utils import is_cuda
import sglang.srt.layers.layernorm as layernorm
import sglang.srt.layers.attention.triton_backend
import sglang.srt.layers.quantization.utils as quantization
import sglang.kernels.ops.gemm.cutedsl_dual_gemm
import sglang.srt.models.qwen3_vl
scalar_type, _ = quantization.get_scalar_types()
print(json.dumps({
    "cuda": is_cuda(),
    "rmsnorm": layernorm.rmsnorm.__module__,
    "scalar_type": scalar_type.__name__,
}))
"""


@pytest.mark.slow
def test_sglangs_cuda_import_chain_binds_the_stand_ins_and_calls_none(
    sglang_cpu_runtime, sglang_0_5_23
):
    tree, _ = sglang_0_5_23
    path = os.pathsep.join([str(tree / "python"), str(STAND_INS)])
    environment = dict(os.environ, PYTHONPATH=path)
    environment |= HOST_TORCH_PLATFORM.environment
    finished = subprocess.run(
        [sglang_cpu_runtime["python"], "-c", CUDA_IMPORT_CHAIN],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    facts = json.loads(finished.stdout.splitlines()[-1])
    assert facts == {
        "cuda": True,
        "rmsnorm": "sgl_kernel",
        "scalar_type": "MockScalarType",
    }
    assert not [call for call in stand_in_calls(finished.stderr) if call.placeholder]


# --- the runtime beside the host's Python -----------------------------------------


def wheel(directory: Path, name: str, version: str, module: str) -> Path:
    """A real, minimal wheel of one pure-Python module."""
    distribution = f"{name}-{version}"
    files = {
        f"{name}.py": module,
        f"{distribution}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        ),
        f"{distribution}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in files.items():
        digest = hashlib.sha256(text.encode()).digest()
        encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{path},sha256={encoded},{len(text.encode())}")
    record.append(f"{distribution}.dist-info/RECORD,,")
    files[f"{distribution}.dist-info/RECORD"] = "\n".join(record) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{distribution}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as bundle:
        for member, text in files.items():
            bundle.writestr(member, text)
    return path


def lock_of(path: Path, wheels: list[Path]) -> Path:
    lines = []
    for built in wheels:
        name, version = built.name.split("-")[:2]
        digest = hashlib.sha256(built.read_bytes()).hexdigest()
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{digest}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def runtime_folder(tmp_path) -> tuple[Path, Path]:
    """A lock of one real wheel, put in the runtime's wheels/ beforehand."""
    dest = tmp_path / "runtime"
    built = wheel(dest / "wheels", "serving_probe_pkg", "1.0", "ANSWER = 42\n")
    return lock_of(tmp_path / "requirements.lock", [built]), dest


def test_the_runtime_installs_the_lock_beside_the_hosts_python_offline(runtime_folder):
    lock, dest = runtime_folder
    record = ensure_host_torch_runtime(lock, dest, progress=lambda line: None)

    assert record["python"] == sys.executable and record["kind"] == "host-torch"
    assert record["installed"] == {"serving-probe-pkg": "1.0"}
    assert record["sglang_pins"]["torch"] == "2.14.1"
    assert record["packages"]["torch"]  # this host's, named beside SGLang's pin
    answer = subprocess.run(
        [sys.executable, "-c", "import serving_probe_pkg as p; print(p.ANSWER)"],
        env=dict(os.environ, PYTHONPATH=record["site"]),
        capture_output=True,
        text=True,
    )
    assert answer.stdout.strip() == "42"
    assert json.loads((dest / "runtime.json").read_text()) == record

    lines = []
    assert ensure_host_torch_runtime(lock, dest, progress=lines.append) == record
    assert lines and lines[0].startswith("reusing ")
    (Path(record["site"]) / "serving_probe_pkg.py").write_text("ANSWER = 0\n")
    with pytest.raises(RecordedFileChanged, match="serving_probe_pkg.py changed"):
        ensure_host_torch_runtime(lock, dest, progress=lambda line: None)


def test_a_wheel_that_is_not_the_locks_is_refused(runtime_folder, tmp_path):
    lock, dest = runtime_folder
    other = wheel(tmp_path / "elsewhere", "serving_probe_pkg", "1.0", "ANSWER = 7\n")
    (dest / "wheels" / other.name).write_bytes(other.read_bytes())
    with pytest.raises(RuntimeBuildError, match="pip install exited"):
        ensure_host_torch_runtime(lock, dest, progress=lambda line: None)
    assert not (dest / "runtime.json").exists() and not (dest / "site").exists()


def test_a_wheel_missing_from_the_folder_is_named(runtime_folder):
    lock, dest = runtime_folder
    pins = {"serving-probe-pkg": "1.0", "transformers": "5.19.0"}
    assert missing_wheels(dest / "wheels", pins) == ["transformers==5.19.0"]


def test_the_lock_and_stand_ins_the_workflow_names_exist():
    for relative in (HOST_TORCH_PLATFORM.runtime_lock, GPU_STAND_IN_DIRECTORY):
        assert (PROJECT_ROOT / relative).exists(), relative


def test_the_pilot_is_the_config_less_two_arms(config):
    """What its header says: gpu-host-real.yaml's server, model, workload, quota
    and bounds, five of its arms as it has them (three runs each), every claim on
    two runs a side."""
    path = PROJECT_ROOT / "config" / "gpu-host-real-pilot.yaml"
    schema = PROJECT_ROOT / "config" / "schema" / "config.schema.yaml"
    pilot = check_config(
        yaml.safe_load(path.read_text()), schema, [str(path)], PROJECT_ROOT
    )
    for key in ("engine", "runtime", "sources", "variants", "workloads", "sglang"):
        assert pilot[key] == config[key], key
    assert (pilot["client"], pilot["host_sharing"]) == (
        config["client"],
        config["host_sharing"],
    )
    arms = {arm["name"]: arm for arm in config["arms"]}
    assert [arm["name"] for arm in pilot["arms"]] == ["A", "B", "C", "E", "A-passive"]
    for arm in pilot["arms"]:
        assert arm == arms[arm["name"]]
    bounds = {claim["name"]: claim for claim in config["claims"]}
    for claim in pilot["claims"]:
        assert claim["min_valid_runs"] == 2
        assert claim["bound_from"] == bounds[claim["name"]]["bound_from"]
        assert claim.get("at_least") == bounds[claim["name"]].get("at_least")
