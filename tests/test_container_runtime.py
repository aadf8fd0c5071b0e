"""Arms in containers: image contexts and commands, and real Docker runs.

The first half needs no container engine: the ``docker run`` / ``docker build``
argument lists, the /dev/shm size, the build contexts of both engines' images (from
the real SGLang 0.5.23 source) and the check of ``mm_utils.py`` that both
Dockerfiles run. The tests marked ``docker`` build and run real containers; they
skip, saying why, when no Docker engine answers (``.ci/container-engine.sh start``
starts one and prints the DOCKER_HOST to export).
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests
from PIL import Image
from study_helpers import (
    arm_record,
    assert_ran_as_planned,
    container_plan,
    docker,
)

from serving_study.config.records import ServerSettings
from serving_study.engine.preprocess import preprocess_image
from serving_study.files import file_sha256
from serving_study.launch.engines import (
    container_options,
    largest_tensor_bytes,
    shared_memory_bytes,
)
from serving_study.launch.plan import EngineCommand
from serving_study.measure.server_queries import ServerNeverHealthy, wait_until_healthy
from serving_study.report.settings import ReportSettings
from serving_study.report.study_setup import container_allowance
from serving_study.servers.container_commands import (
    QUOTA_INSIDE_SCRIPT,
    gpu_options,
    parse_quota,
    run_command,
)
from serving_study.servers.container_runtime import ContainerServer
from serving_study.servers.host import unmet_needs
from serving_study.servers.local_runtime import free_port
from serving_study.servers.shared_memory import namespace_pid, segment_creator
from serving_study.sources.images import (
    EMBEDDED_PYTHON,
    EMBEDDED_VARIANT_ROOT,
    ImageBuildFailed,
    assemble_context,
    build_arguments,
    build_command,
    build_variant_image,
    image_tag,
    inspect_image,
    read_image_id,
    run_build,
)
from serving_study.sources.variants import prepare_variant
from serving_study.sources.wheelhouse import (
    WheelhouseFailed,
    manylinux_platforms,
    refuse_cuda_wheels,
)

ROOT = Path(__file__).resolve().parents[1]
BASE_IMAGE = "localhost/bookworm-minbase:latest"
MIB = 1 << 20
EMBEDDED_SETTINGS = {
    "embedded_base_image": BASE_IMAGE,
    "embedded_python_version": "3.11",
    "embedded_glibc_version": "2.36",
    "ipc_host": False,
    "gpus": "auto",
}


def option_value(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, item in enumerate(argv) if item == option]


def write_manifest(directory: Path, sizes: list[tuple[int, int]]) -> Path:
    images = [{"width": width, "height": height} for width, height in sizes]
    manifest = directory / "manifest.json"
    manifest.write_text(json.dumps({"images": images}))
    return manifest


# --- docker run ----------------------------------------------------------------------


def test_run_command_carries_quota_shm_environment_and_label():
    plan = container_plan(
        ["python", "-m", "serving_study.engine", "--port", "1234"],
        "sha256:abc",
        environment={"OMP_NUM_THREADS": "8", "SGLANG_VLM_CACHE_SIZE_MB": "0"},
        quota_cores=13.6,
        shm_size="3328m",
    )
    argv = run_command(plan, "serving-study-x", "x")
    assert argv[:3] == ["docker", "run", "--detach"]
    assert option_value(argv, "--name") == "serving-study-x"
    assert option_value(argv, "--label") == "serving-study.run=x"
    assert option_value(argv, "--cpus") == "13.6"
    assert option_value(argv, "--shm-size") == "3328m"
    assert "--network=host" in argv and "--ipc=host" not in argv
    assert option_values(argv, "--env") == [
        "OMP_NUM_THREADS=8",
        "SGLANG_VLM_CACHE_SIZE_MB=0",
    ]
    image_at = argv.index("sha256:abc")
    assert argv[image_at + 1 :] == ["python", "-m", "serving_study.engine"] + [
        "--port",
        "1234",
    ]


def test_host_ipc_replaces_the_private_shm_and_mounts_are_read_only():
    plan = container_plan(
        ["true"],
        "img",
        runtime="podman",
        shm_size="2048m",
        ipc_host=True,
        read_only_mounts=[("/data/models/Qwen", "/models/Qwen")],
    )
    argv = run_command(plan, "n", "n")
    assert argv[:2] == ["podman", "run"]
    assert "--ipc=host" in argv and "--shm-size" not in argv
    assert "--cpus" not in argv
    assert option_value(argv, "--volume") == "/data/models/Qwen:/models/Qwen:ro"


def test_an_image_or_a_context_that_looks_like_an_option_stays_a_value(tmp_path):
    run = run_command(
        container_plan(["true"], "--privileged", runtime="podman"), "n", "n"
    )
    build = build_command(
        "docker",
        Path("--output=type=local,dest=out"),
        tag="localhost/serving-study-embedded:x",
        arguments={},
        labels={},
        image_id_file=tmp_path / "x.iid",
    )
    assert run[-3:] == ["--", "--privileged", "true"]
    assert build[-2:] == ["--", "--output=type=local,dest=out"]


def test_docker_takes_an_image_that_looks_like_an_option_as_an_image():
    """The docker client reads the image before it asks the engine anything."""
    if shutil.which("docker") is None:
        pytest.skip("the docker client is not installed")
    argv = run_command(
        container_plan([], "--help"), "serving-study-hostile-image", "hostile-image"
    )
    finished = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    # Read as an option, "--help" would print the usage and exit 0.
    assert finished.returncode != 0
    assert "invalid reference format" in finished.stderr
    assert "Usage:" not in finished.stdout


def test_quota_is_given_at_start_only_when_startup_runs_under_it():
    def container(timing: str) -> ContainerServer:
        plan = container_plan(["true"], "img", quota_cores=0.5, quota_timing=timing)
        return ContainerServer(plan, "exp-A-run1-1-try1", Path("/dev/null"))

    assert option_value(container("start").runtime_argv, "--cpus") == "0.5"
    assert "--cpus" not in container("healthy").runtime_argv
    assert container("healthy").name == "serving-study-exp-A-run1-1-try1"


def test_gpus_for_docker_and_as_cdi_devices_for_podman():
    assert gpu_options("docker", "none") == []
    assert gpu_options("docker", "all") == ["--gpus", "all"]
    assert gpu_options("docker", "device=0,1") == ["--gpus", '"device=0,1"']
    assert gpu_options("podman", "all") == ["--device", "nvidia.com/gpu=all"]
    assert gpu_options("podman", "device=0,1") == [
        "--device",
        "nvidia.com/gpu=0",
        "--device",
        "nvidia.com/gpu=1",
    ]


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_containers_get_no_capabilities_and_no_new_privileges(runtime):
    image = "sha256:" + "a" * 64
    plan = container_plan(["true"], image, runtime=runtime, quota_cores=1.0)
    argv = run_command(plan, "n", "n")
    options = argv[: argv.index(image)]
    assert option_values(options, "--cap-drop") == ["ALL"]
    assert option_values(options, "--security-opt") == ["no-new-privileges"]
    assert "--cap-add" not in options and "--privileged" not in options
    # Only the mounts, /dev/shm and a scratch /tmp are writable; pids are bounded.
    assert "--read-only" in options and option_value(options, "--pids-limit") == "4096"
    assert option_value(options, "--tmpfs").startswith("/tmp:rw,")


def test_an_image_id_file_must_hold_an_image_id(tmp_path):
    image_id = "sha256:" + "b" * 64
    (tmp_path / "built.iid").write_text(image_id + "\n")
    assert read_image_id(tmp_path / "built.iid") == image_id
    (tmp_path / "tag.iid").write_text("localhost/serving-study-embedded:original\n")
    with pytest.raises(ImageBuildFailed, match="not an image id"):
        read_image_id(tmp_path / "tag.iid")


# --- /dev/shm size ------------------------------------------------------------------


@pytest.mark.parametrize("size", [(512, 512), (700, 300), (2048, 2048)])
def test_largest_tensor_is_what_the_preprocessor_really_makes(tmp_path, size):
    manifest = write_manifest(tmp_path, [(256, 256), size])
    features = preprocess_image(Image.new("RGB", size))
    assert largest_tensor_bytes(manifest) == features.pixel_values.nbytes


def test_shared_memory_holds_two_tensors_per_request_in_flight(tmp_path):
    assert shared_memory_bytes(100_663_296, 16) == (2 * 16 * 96 + 256) * MIB
    assert shared_memory_bytes(6 * MIB, 4) == 1024 * MIB  # the 1 GiB floor


def options_of(container: dict, tmp_path: Path, wants_gpus: bool = False):
    """A container's options from the config's ``container`` section, for an
    arm at concurrency 16 on 2048 px images, of an engine that wants GPUs or not."""
    manifest = write_manifest(tmp_path, [(2048, 2048)])
    image_id = tmp_path / "built.iid"
    image_id.write_text("sha256:" + "c" * 64)
    server = ServerSettings.from_config(
        {"engine": "embedded", "runtime": "docker", "container": container},
        image_id_file=image_id,
    )
    command = EngineCommand(
        ("true",), {}, "SIGTERM", False, "m", "server_info", wants_gpus=wants_gpus
    )
    return container_options(server, arm_record(concurrency=16), command, manifest)


def test_container_options_from_config(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    computed = options_of(EMBEDDED_SETTINGS, tmp_path)
    assert (computed.shm_size, computed.ipc_host, computed.gpus) == (
        "3328m",
        False,
        None,
    )
    assert computed.image == "sha256:" + "c" * 64
    fixed = EMBEDDED_SETTINGS | {"shm_size": "16g"}
    assert options_of(fixed, tmp_path, wants_gpus=True).shm_size == "16g"
    assert options_of(fixed, tmp_path, wants_gpus=True).gpus == "device=0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert options_of(fixed, tmp_path, wants_gpus=True).gpus == "device=3"
    assert options_of(fixed | {"gpus": "all"}, tmp_path, wants_gpus=True).gpus == "all"
    assert options_of(fixed, tmp_path, wants_gpus=False).gpus is None
    assert options_of(fixed | {"gpus": "device=1"}, tmp_path).gpus == "device=1"
    shared = EMBEDDED_SETTINGS | {"ipc_host": True}
    assert options_of(shared, tmp_path).shm_size is None


def test_preflight_refuses_a_quota_docker_cannot_give():
    host = {
        "cpu_count": 2,
        "shared_memory_free_mib": 10_000,
        "gpu": {"gpus": [], "reason": "no NVIDIA driver"},
        "container_runtimes": {"docker": {"installed": True, "engine_reachable": True}},
    }
    docker_engine = {"engine": "embedded", "runtime": "docker"}
    arms = [arm_record(cpu_quota=13.6), arm_record(name="B")]
    (need,) = unmet_needs(host, docker_engine, arms)
    assert "may not exceed this host's 2 CPUs" in need and "13.6" in need
    fitting = arm_record(cpu_quota=2)
    assert unmet_needs(host, docker_engine, [fitting]) == []


def test_quota_text_as_read_inside():
    assert parse_quota("50000 100000\n")["cores"] == 0.5
    assert parse_quota("max 100000")["cores"] is None
    assert parse_quota("-1 100000")["quota_us"] is None


def test_segment_creators_and_namespace_pids():
    assert segment_creator("sgl_shm_mm_1_0a1b2c3d") == 1
    assert segment_creator("torch_123") is None
    # This test runs in the host's pid namespace (or its own container's).
    assert namespace_pid(os.getpid()) is not None


# --- Images: contexts, commands, the mm_utils check --------------------------------


@pytest.fixture(scope="module")
def variants(sglang_0_5_23, tmp_path_factory) -> dict[str, dict]:
    """The original and patched variants of the real SGLang 0.5.23 source."""
    tree, identity = sglang_0_5_23
    root = tmp_path_factory.mktemp("variants")
    patch = ROOT / "envs/patches/pr48881-shm-copy-without-thread-fanout.patch"
    original = {"name": "original", "source": "sglang-0.5.23"}
    patched = original | {"name": "patched", "patch": str(patch.relative_to(ROOT))}
    return {
        "original": prepare_variant(original, tree, identity, None, root / "o"),
        "patched": prepare_variant(patched, tree, identity, patch, root / "p"),
    }


@pytest.fixture
def fake_wheelhouse(tmp_path) -> Path:
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "requirements.txt").write_text("numpy==2.4.6\n")
    (wheelhouse / "constraints.txt").write_text("numpy==2.4.6\n")
    (wheelhouse / "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    (wheelhouse / "wheelhouse.json").write_text("{}")
    return wheelhouse


def test_embedded_context_holds_wheels_package_and_the_variant(
    variants, fake_wheelhouse, tmp_path
):
    variant = variants["patched"]
    context = assemble_context(
        "embedded",
        variant,
        tmp_path / "context",
        dockerfile=ROOT / "envs/Dockerfile.embedded",
        verify_script=ROOT / "envs/verify_mm_utils.py",
        package_directory=ROOT / "src/serving_study",
        wheelhouse=fake_wheelhouse,
    )
    assert (context / "Dockerfile").read_text().startswith("# One variant of the embed")
    assert (context / "verify_mm_utils.py").is_file()
    assert sorted(path.name for path in (context / "wheelhouse").iterdir()) == [
        "constraints.txt",
        "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl",
        "requirements.txt",
    ]
    assert (context / "serving-study/src/serving_study/engine/__main__.py").is_file()
    assert not list(context.rglob("__pycache__"))
    mm_utils = context / "variant/python/sglang/srt/managers/mm_utils.py"
    assert file_sha256(mm_utils) == variant["mm_utils_sha256"]


def test_sglang_context_holds_the_variant_package_and_the_probe(variants, tmp_path):
    context = assemble_context(
        "sglang",
        variants["original"],
        tmp_path / "context",
        dockerfile=ROOT / "envs/Dockerfile.sglang",
        verify_script=ROOT / "envs/verify_mm_utils.py",
        python_path_directories=[ROOT / "envs/server-probe"],
    )
    assert sorted(path.name for path in context.iterdir()) == [
        "Dockerfile",
        "serving-study",
        "variant",
        "verify_mm_utils.py",
    ]
    assert (context / "serving-study/server-probe/sitecustomize.py").is_file()
    assert "FROM ${BASE_IMAGE}" in (context / "Dockerfile").read_text()
    mm_utils = context / "variant/python/sglang/srt/managers/mm_utils.py"
    assert file_sha256(mm_utils) == variants["original"]["mm_utils_sha256"]


def test_build_command_writes_the_image_id_and_labels(tmp_path):
    argv = build_command(
        "podman",
        tmp_path,
        tag="localhost/serving-study-embedded:original",
        arguments={"MM_UTILS_SHA256": "ab" * 32, "BASE": BASE_IMAGE},
        labels={"serving-study.variant": "original"},
        image_id_file=tmp_path / "original.iid",
    )
    assert argv[:2] == ["podman", "build"]
    assert option_value(argv, "--iidfile") == str(tmp_path / "original.iid")
    assert option_value(argv, "--file") == str(tmp_path / "Dockerfile")
    assert "--network=host" in argv and "--force-rm" in argv
    assert option_values(argv, "--build-arg") == [
        f"BASE={BASE_IMAGE}",
        f"MM_UTILS_SHA256={'ab' * 32}",
    ]
    assert option_value(argv, "--label") == "serving-study.variant=original"
    assert argv[-1] == str(tmp_path)


def test_build_arguments_of_each_engine(variants):
    variant = variants["patched"]
    embedded = build_arguments("embedded", variant, EMBEDDED_SETTINGS)
    assert embedded == {
        "MM_UTILS_SHA256": variant["mm_utils_sha256"],
        "BASE": BASE_IMAGE,
        "PYTHON_VERSION": "3.11",
    }
    pinned = "lmsysorg/sglang:v0.5.23@sha256:" + "0" * 64
    sglang = build_arguments("sglang", variant, {"base_image": pinned})
    assert sglang["BASE_IMAGE"] == pinned


@pytest.mark.parametrize("base_image", [None, "lmsysorg/sglang:v0.5.23"])
def test_an_unpinned_sglang_image_is_refused(variants, base_image):
    with pytest.raises(ImageBuildFailed, match="pinned by digest"):
        build_arguments("sglang", variants["original"], {"base_image": base_image})


def test_image_tags_are_valid_names():
    assert image_tag("embedded", "Patched_v2") == (
        "localhost/serving-study-embedded:patched_v2"
    )
    assert (
        image_tag("sglang", "..odd name!") == "localhost/serving-study-sglang:odd-name"
    )


def verify(*arguments: str) -> subprocess.CompletedProcess:
    script = ROOT / "envs/verify_mm_utils.py"
    return subprocess.run(
        [sys.executable, "-I", str(script), *arguments],
        capture_output=True,
        text=True,
    )


def test_the_mm_utils_check_accepts_the_variant_and_refuses_another(variants):
    patched, original = variants["patched"], variants["original"]
    root = patched["sglang_python_root"]
    accepted = verify(patched["mm_utils_sha256"], root)
    assert accepted.returncode == 0, accepted.stderr
    assert "is the variant's" in accepted.stdout
    refused = verify(original["mm_utils_sha256"], root)
    assert refused.returncode == 1
    assert f"has sha256 {patched['mm_utils_sha256']}" in refused.stderr
    assert verify("not-a-sha").returncode == 2


def test_without_sglang_the_check_fails(tmp_path):
    refused = verify("0" * 64, str(tmp_path))
    assert refused.returncode == 1
    assert "no sglang package is importable" in refused.stderr


# --- Wheelhouse --------------------------------------------------------------------


def pins(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return dict(line.split("==") for line in lines if "==" in line)


def test_image_requirements_are_pinned_as_the_host_ones():
    image = pins(ROOT / "envs/embedded-requirements.txt")
    host = pins(ROOT / "requirements.txt")
    assert {"torch", "numpy", "pillow", "aiohttp", "setproctitle"} <= set(image)
    assert {name: host[name] for name in image} == image


def test_manylinux_tags_for_bookworm():
    tags = manylinux_platforms("2.36")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux1_x86_64" in tags
    assert "manylinux_2_37_x86_64" not in tags


def test_cuda_wheels_are_refused():
    refuse_cuda_wheels([Path("torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl")])
    with pytest.raises(WheelhouseFailed, match="PIP_FIND_LINKS"):
        refuse_cuda_wheels([Path("nvidia_cublas_cu12-12.8.4.1-py3-none-any.whl")])


# --- Real containers (Docker) ------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_image(docker_study) -> str:
    return (
        (docker_study / "results/test-docker/images/original.iid").read_text().strip()
    )


def containers_of_runs() -> list[str]:
    listed = docker("ps", "--all", "--filter", "label=serving-study.run")
    return listed.stdout.splitlines()[1:]


def engine_argv(port: int) -> list[str]:
    """The embedded engine in its image, serving on ``port``."""
    engine = [EMBEDDED_PYTHON, "-m", "serving_study.engine"]
    return engine + ["--port", str(port), "--sglang-source", EMBEDDED_VARIANT_ROOT]


SLEEPING = [EMBEDDED_PYTHON, "-c", "import time; time.sleep(120)"]


def container_server(
    argv: list[str],
    name: str,
    image: str,
    log_directory: Path,
    *,
    environment: dict[str, str] | None = None,
    quota_cores: float | None = None,
    quota_timing: str = "start",
    shm_size: str = "64m",
    **options,
) -> ContainerServer:
    """A server of ``argv`` in a container of ``image``, not started yet. Its
    cgroup is ``name`` and this test's pid (tests on one engine stay apart), its
    log server.log in ``log_directory``; unless the test says otherwise it has no
    environment and no quota, a quota would hold from the start, and its
    /dev/shm is 64 MB."""
    plan = container_plan(
        argv,
        image,
        environment=environment,
        quota_cores=quota_cores,
        quota_timing=quota_timing,
        shm_size=shm_size,
        **options,
    )
    return ContainerServer(plan, f"{name}-{os.getpid()}", log_directory / "server.log")


@pytest.mark.docker
def test_each_arm_ran_in_its_variants_container_under_its_quota(docker_study):
    results = docker_study / "results/test-docker"
    assert "--read-only" in (results / "report.html").read_text()
    for arm, quota in (("original", 0.5), ("patched", 1.0)):
        metrics = json.loads((results / arm / "run1/metrics.json").read_text())
        assert metrics["valid"], metrics["invalid_reasons"]
        assert metrics["requests_completed"] == 12
        provenance = json.loads((results / arm / "run1/provenance.json").read_text())
        assert option_value(provenance["runtime_argv"], "--cpus") == f"{quota:g}"
        assert_ran_as_planned(docker_study, "test-docker", arm)
        assert provenance["quota_seen_inside"]["cores"] == pytest.approx(quota)
        assert provenance["quota_in_force"]["cores"] == pytest.approx(quota)
        assert provenance["image"] == (
            (docker_study / f"results/test-docker/images/{arm}.iid").read_text().strip()
        )
        # The engine in the container loaded the variant's own mm_utils.py.
        server_info = provenance["server_info"]
        assert (
            server_info["mm_utils_sha256"] == provenance["variant"]["mm_utils_sha256"]
        )
        assert server_info["sglang_source"] == EMBEDDED_VARIANT_ROOT
        assert provenance["launch"]["argv"][0] == EMBEDDED_PYTHON
        assert provenance["leaked_segments_removed"] == []
    assert (results / "report.html").is_file()


@pytest.mark.docker
def test_each_image_holds_its_variant_and_says_so(docker_study):
    records = {}
    for variant in ("original", "patched"):
        identity = json.loads(
            (docker_study / f"results/test-docker/variants/{variant}.json").read_text()
        )
        record = json.loads(
            (
                docker_study / f"results/test-docker/images/{variant}.inspect.json"
            ).read_text()
        )
        labels = record["Config"]["Labels"]
        assert labels["serving-study.mm-utils-sha256"] == identity["mm_utils_sha256"]
        assert labels["serving-study.variant"] == variant
        # The build's own check, run again in the finished image (the build may
        # have taken that step from its cache).
        checked = docker(
            "run",
            "--rm",
            "--network=none",
            record["Id"],
            "python3",
            "/usr/local/lib/serving-study/verify_mm_utils.py",
            identity["mm_utils_sha256"],
            EMBEDDED_VARIANT_ROOT,
        )
        assert f"is the variant's ({identity['mm_utils_sha256']})" in checked.stdout
        records[variant] = record
    assert records["original"]["Id"] != records["patched"]["Id"]
    # The base, Python and the venv (about 1 GB) are one set of layers for both
    # variants: the second build reuses them. (Our package's layer is shared too
    # unless src/serving_study changed between the two builds.)
    original_layers = records["original"]["RootFS"]["Layers"]
    patched_layers = records["patched"]["RootFS"]["Layers"]
    assert original_layers[:3] == patched_layers[:3]
    assert original_layers[-1] != patched_layers[-1]


@pytest.mark.docker
def test_no_container_of_the_study_is_left(docker_study):
    assert [line for line in containers_of_runs() if "test-docker" in line] == []


@pytest.mark.docker
def test_quota_applied_once_healthy_and_teardown_sweeps_shared_memory(
    embedded_image, tmp_path
):
    port = free_port()
    server = container_server(
        engine_argv(port),
        "quota-after-start",
        embedded_image,
        tmp_path,
        environment={"OMP_NUM_THREADS": "1"},
        quota_cores=0.5,
        quota_timing="healthy",
        shm_size="300m",
    )
    try:
        server.start()
        assert server.group.quota_in_force()["cores"] is None
        wait_until_healthy(f"http://127.0.0.1:{port}", 120, process=server.process)
        server.apply_quota()
        assert server.quota_seen_inside()["cores"] == pytest.approx(0.5)
        assert server.group.quota_in_force()["cores"] == pytest.approx(0.5)
        info = requests.get(f"http://127.0.0.1:{port}/server_info", timeout=10).json()
        assert info["thread_env"]["OMP_NUM_THREADS"] == "1"
        assert info["torch_num_threads"] == 1
        # Nothing of this host's environment went in: only what the arm set.
        environment = psutil.Process(server.pid).environ()
        assert (
            "VIRTUAL_ENV" not in environment
            and "PYTEST_CURRENT_TEST" not in environment
        )
        shared_memory = os.statvfs(f"/proc/{server.pid}/root/dev/shm")
        assert shared_memory.f_blocks * shared_memory.f_frsize == 300 * MIB
        # A segment left behind, as a crashed request would leave it.
        docker(
            "exec",
            server.container_id,
            "sh",
            "-c",
            "echo x > /dev/shm/sgl_shm_mm_1_0badf00d",
        )
        server.remember_tree()
        pids, group_directory = set(server.known_pids), server.group.cpu_directory
        assert server.pid in pids and 1 in server.namespace_pids
    finally:
        server.stop()
    assert server.leaked_segments == ["sgl_shm_mm_1_0badf00d"]
    assert server.exit_code() == 0  # the engine stopped cleanly on SIGTERM
    assert not any(psutil.pid_exists(pid) for pid in pids)
    assert not group_directory.exists()
    assert docker("inspect", server.container_id, check=False).returncode != 0


# Prints the CPU quota its container's processes see, read as the runner reads it,
# when it is stopped.
QUOTA_REPORTING_SERVER = [
    "sh",
    "-c",
    f"trap 'echo \"quota at stop: $({QUOTA_INSIDE_SCRIPT})\"; exit 0' TERM; "
    "echo ready; sleep 120 & wait",
]


@pytest.mark.docker
def test_a_container_stops_without_its_quota(embedded_image, tmp_path):
    # A stop is not measured; under the arm's quota it only takes longer.
    server = container_server(
        QUOTA_REPORTING_SERVER,
        "quota-lifted",
        embedded_image,
        tmp_path,
        quota_cores=0.5,
    )
    try:
        server.start()
        deadline = time.monotonic() + 60
        while "ready" not in server.log_tail() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.quota_seen_inside()["cores"] == pytest.approx(0.5)
    finally:
        server.stop()
    assert server.exit_code() == 0
    (at_stop,) = [
        line for line in server.log_tail().splitlines() if "quota at stop:" in line
    ]
    quota = parse_quota(at_stop.split("quota at stop:", 1)[1])
    assert quota["cores"] == pytest.approx(os.cpu_count())


@pytest.mark.docker
def test_a_server_that_exits_is_reported_with_its_code_and_log(
    embedded_image, tmp_path
):
    server = container_server(
        [EMBEDDED_PYTHON, "-c", "print('giving up', flush=True); raise SystemExit(3)"],
        "exits",
        embedded_image,
        tmp_path,
    )
    try:
        server.start()
        with pytest.raises(ServerNeverHealthy, match="exited with code 3"):
            wait_until_healthy(
                f"http://127.0.0.1:{free_port()}", 60, process=server.process
            )
    finally:
        server.stop()
    assert "giving up" in server.log_tail()
    assert docker("inspect", server.container_id, check=False).returncode != 0


@pytest.mark.docker
def test_a_refused_start_is_an_exit_code_not_an_exception(docker_engine, tmp_path):
    server = container_server(
        ["true"], "refused", "sha256:" + "0" * 64, tmp_path, quota_cores=1.0
    )
    try:
        server.start()
    finally:
        server.stop()
    assert server.exit_code() not in (None, 0)
    assert "docker run` failed" in server.log_tail()


def the_wheelhouse(workdir: Path, kind: str) -> Path:
    """The study's one wheelhouse of ``kind`` (its folder holds a platform hash)."""
    (wheelhouse,) = (workdir / "resources").glob(f"{kind}-????????????")
    return wheelhouse


@pytest.mark.docker
def test_the_build_fails_when_the_image_would_not_run_the_variant(
    docker_study, tmp_path
):
    """The embedded image's last step is the mm_utils.py check; a variant record
    whose sha256 is not its tree's must fail the build, naming both."""
    variant = json.loads(
        (docker_study / "results/test-docker/variants/original.json").read_text()
    )
    wrong = variant | {"mm_utils_sha256": "0" * 64}
    containers_before = docker("ps", "--all", "--quiet").stdout.split()
    with pytest.raises(ImageBuildFailed) as failure:
        build_variant_image(
            runtime="docker",
            engine="embedded",
            variant=wrong,
            settings=EMBEDDED_SETTINGS,
            dockerfile=ROOT / "envs/Dockerfile.embedded",
            verify_script=ROOT / "envs/verify_mm_utils.py",
            image_id_file=tmp_path / "wrong.iid",
            inspect_file=tmp_path / "wrong.inspect.json",
            log_path=tmp_path / "build.log",
            package_directory=ROOT / "src/serving_study",
            wheelhouse=the_wheelhouse(docker_study, "wheelhouse"),
        )
    assert f"has sha256 {variant['mm_utils_sha256']}" in str(failure.value)
    assert not (tmp_path / "wrong.iid").exists()
    # The failed step's container went with it.
    assert docker("ps", "--all", "--quiet").stdout.split() == containers_before


@pytest.mark.docker
def test_sglang_dockerfile_puts_the_variant_over_an_editable_install(
    embedded_image, docker_study, tmp_path
):
    """Dockerfile.sglang on a stand-in for the official image: the embedded image
    with a release's sglang installed editable under /sgl-workspace (the real base
    image needs a registry and a GPU host)."""
    stand_in = tmp_path / "stand-in"
    stand_in.mkdir()
    package = "/sgl-workspace/sglang/python/sglang"
    (stand_in / "Dockerfile").write_text(
        f"FROM {embedded_image}\n"
        f"RUN mkdir -p {package}/srt/managers/__pycache__ "
        f"&& touch {package}/__init__.py {package}/release_only.py "
        f"&& echo '# the release' > {package}/srt/managers/mm_utils.py "
        '&& python3 -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_path('
        "'purelib'), 'sglang.pth').write_text('/sgl-workspace/sglang/python')\"\n"
    )
    base_tag = f"localhost/serving-study-test/sglang-stand-in:{os.getpid()}"
    image_id_file = tmp_path / "sglang.iid"
    try:
        docker("build", "--quiet", "--tag", base_tag, str(stand_in))
        variant = json.loads(
            (docker_study / "results/test-docker/variants/patched.json").read_text()
        )
        context = assemble_context(
            "sglang",
            variant,
            tmp_path / "context",
            dockerfile=ROOT / "envs/Dockerfile.sglang",
            verify_script=ROOT / "envs/verify_mm_utils.py",
            python_path_directories=[ROOT / "envs/server-probe"],
        )
        arguments = {
            "BASE_IMAGE": base_tag,
            "MM_UTILS_SHA256": variant["mm_utils_sha256"],
        }
        run_build(
            build_command(
                "docker",
                context,
                tag=f"{base_tag}-variant",
                arguments=arguments,
                labels={},
                image_id_file=image_id_file,
            ),
            tmp_path / "build.log",
        )
        image_id = image_id_file.read_text().strip()
        listing = docker(
            "run",
            "--rm",
            "--network=none",
            image_id,
            "sh",
            "-c",
            f"sha256sum {package}/srt/managers/mm_utils.py; "
            f"ls {package}/release_only.py; ls -d {package}/srt/managers/__pycache__; "
            'echo "PYTHONPATH=$PYTHONPATH"',
            check=False,
        )
        assert variant["mm_utils_sha256"] in listing.stdout
        assert "release_only.py" in listing.stdout  # the release's extra files stay
        assert "__pycache__" in listing.stderr  # stale bytecode is gone
        # The load probe is on the server's path, as on every real server.
        assert "PYTHONPATH=/opt/serving-study/server-probe" in listing.stdout
        assert inspect_image("docker", image_id)["Id"] == image_id
    finally:
        docker("image", "rm", "--force", f"{base_tag}-variant", base_tag, check=False)


@pytest.mark.docker
def test_monitors_see_the_containers_processes_from_the_host(embedded_image, tmp_path):
    """The scheduler inside is a host process the monitors can find and sample, in
    the container's own cgroup under its quota."""
    from serving_study.measure.monitors import RunMonitors
    from serving_study.measure.server_processes import find_server_processes

    port = free_port()
    server = container_server(
        engine_argv(port),
        "monitors",
        embedded_image,
        tmp_path,
        quota_cores=1.0,
        shm_size="256m",
    )
    try:
        server.start()
        wait_until_healthy(f"http://127.0.0.1:{port}", 120, process=server.process)
        found = find_server_processes(server.pid, server.group.pids())
        assert found.main.pid == server.pid
        assert found.scheduler is not None and found.scheduler.ppid() == server.pid
        monitors = RunMonitors(server.pid, server.group, gpu=False)
        try:
            monitors.start_window()
            time.sleep(0.5)
            figures = monitors.stop_window()
        finally:
            monitors.stop()
    finally:
        server.stop()
    processes = figures["processes"]
    assert (processes["main_pid"], processes["scheduler_pid"]) == (
        server.pid,
        found.scheduler.pid,
    )
    assert {server.pid, found.scheduler.pid} <= set(processes["group_pids_at_start"])
    # The cgroup read is the container's: the quota docker run was given.
    assert figures["cgroup"]["quota"]["cores"] == pytest.approx(1.0)


@pytest.mark.docker
def test_the_container_runs_unprivileged_from_the_image_id(embedded_image, tmp_path):
    server = container_server(SLEEPING, "least-privilege", embedded_image, tmp_path)
    try:
        server.start()
        status = Path(f"/proc/{server.pid}/status").read_text().splitlines()
        fields = dict(line.split(":", 1) for line in status)
        for capabilities in ("CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(fields[capabilities], 16) == 0, capabilities
        assert fields["NoNewPrivs"].strip() == "1"
        assert server.image_run == embedded_image
    finally:
        server.stop()


@pytest.mark.docker
def test_a_secret_reaches_the_container_by_name_only(
    embedded_image, tmp_path, monkeypatch
):
    secret = "container-canary-4242"
    monkeypatch.setenv("STUDY_PASSED_VALUE", secret)
    server = container_server(
        SLEEPING,
        "secret-by-name",
        embedded_image,
        tmp_path,
        environment={"OMP_NUM_THREADS": "1"},
        secret_environment=("STUDY_PASSED_VALUE",),
    )
    try:
        server.start()
        inside = psutil.Process(server.pid).environ()
        assert inside["STUDY_PASSED_VALUE"] == secret
    finally:
        server.stop()
    assert option_values(server.runtime_argv, "--env") == [
        "OMP_NUM_THREADS=1",
        "STUDY_PASSED_VALUE",
    ]
    assert not any(secret in item for item in server.runtime_argv)


def test_the_report_says_what_a_container_was_allowed():
    config = {"experiment": "x", "engine": "embedded", "runtime": "docker", "arms": []}
    settings = ReportSettings.from_config(
        config | {"container": {"ipc_host": False, "gpus": "auto"}}
    )
    allowed = container_allowance(settings)
    assert allowed.startswith("docker run --network=host --cap-drop ALL")
    for option in ("--read-only", "--pids-limit 4096", "--tmpfs /tmp:"):
        assert option in allowed
    assert "sized for the workload" in allowed
