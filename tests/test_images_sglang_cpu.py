"""The CPU SGLang image (``envs/Dockerfile.sglang-cpu``): one image per variant with
the real SGLang server inside, on the local Debian base, from the CPU runtime's lock.

The fast tests need no container engine: the build context (the lock's wheelhouse,
the load probe and the sgl-kernel stand-in, the variant's complete tree), the
Dockerfile's layer order (the variant's tree last, so variants share every other
layer), two variants' contexts alike but for their trees, the build arguments, the
tag, the closed lock's wheelhouse and the containers' GPUs. The tests marked
``docker`` and ``slow`` build the patched variant's image for real with the
workflow's rules on config/test/sglang-cpu-docker.yaml and serve its arm from it
(``.ci/container-engine.sh start`` gives the engine; the wheelhouse of the real lock
is downloaded, about 3 GB, and the image is about 7 GB).
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from study_helpers import assert_ran_as_planned, docker, snakemake_command

from serving_study.config.platform import (
    CPU_PLATFORM,
    CPU_RUNTIME_LOCK,
    GPU_PLATFORM,
)
from serving_study.files import file_sha256
from serving_study.launch.sglang import image_engine
from serving_study.sources.images import (
    ENGINES,
    ImageBuildFailed,
    assemble_context,
    build_arguments,
    image_labels,
    image_tag,
)
from serving_study.sources.wheelhouse import (
    WheelhouseFailed,
    download_command,
    lock_pins,
    refuse_wheels_off_the_lock,
)

ROOT = Path(__file__).resolve().parents[1]
# Real SGLang on the CPU, arms in containers: two variants, original and patched.
CPU_DOCKER_CONFIG = ROOT / "config/test/sglang-cpu-docker.yaml"
DOCKERFILE = ROOT / "envs/Dockerfile.sglang-cpu"
BASE_IMAGE = "localhost/bookworm-minbase:latest"
CONTAINER_SETTINGS = {
    "embedded_base_image": BASE_IMAGE,
    "embedded_python_version": "3.11",
    "embedded_glibc_version": "2.36",
    "ipc_host": False,
    "gpus": "auto",
}
MM_UTILS = "srt/managers/mm_utils.py"
TORCH_WHEEL = "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"


# --- A variant and the platform's directories, small and made here ------------------


@pytest.fixture
def variant(tmp_path) -> dict:
    """A variant whose tree has what a wheel's package has: sources, a compiled
    extension, data files, and bytecode that must stay out of the image."""
    package = tmp_path / "variant/python/sglang"
    (package / "srt/managers/__pycache__").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / MM_UTILS).write_text("# the variant's transport\n")
    (package / "srt/managers/__pycache__/mm_utils.cpython-311.pyc").write_bytes(b"x")
    (package / "srt/rust_extensions").mkdir()
    (
        package / "srt/rust_extensions/_server.cpython-311-x86_64-linux-gnu.so"
    ).write_bytes(b"\x7fELF")
    (package / "srt/configs").mkdir()
    (package / "srt/configs/model.json").write_text("{}")
    return {
        "name": "patched",
        "source": {"name": "sglang-0.5.23", "sha256": "cd" * 32},
        "mm_utils_sha256": file_sha256(package / MM_UTILS),
        "sglang_python_root": str(tmp_path / "variant/python"),
    }


@pytest.fixture
def python_path_directories(tmp_path) -> list[Path]:
    """Directories named as the platform's (the load probe, the stand-in)."""
    directories = []
    for name in CPU_PLATFORM.python_path_directories:
        directory = tmp_path / "project" / name
        directory.mkdir(parents=True)
        directories.append(directory)
    (directories[0] / "sitecustomize.py").write_text("# probe\n")
    (directories[1] / "sgl_kernel").mkdir()
    (directories[1] / "sgl_kernel/__init__.py").write_text("# stand-in\n")
    return directories


@pytest.fixture
def lock_wheelhouse(tmp_path) -> Path:
    wheelhouse = tmp_path / "wheelhouse-sglang-cpu"
    wheelhouse.mkdir()
    (wheelhouse / "requirements.txt").write_text("torch==2.14.1\n")
    (wheelhouse / TORCH_WHEEL).write_bytes(b"")
    (wheelhouse / "wheelhouse.json").write_text("{}")
    return wheelhouse


def cpu_context(variant, lock_wheelhouse, python_path_directories, target) -> Path:
    return assemble_context(
        "sglang-cpu",
        variant,
        target,
        dockerfile=DOCKERFILE,
        verify_script=ROOT / "envs/verify_mm_utils.py",
        wheelhouse=lock_wheelhouse,
        python_path_directories=python_path_directories,
    )


# --- The context -----------------------------------------------------------------


def test_context_holds_the_locks_wheels_probe_stand_in_and_the_whole_variant(
    variant, lock_wheelhouse, python_path_directories, tmp_path
):
    context = cpu_context(
        variant, lock_wheelhouse, python_path_directories, tmp_path / "context"
    )
    assert sorted(path.name for path in context.iterdir()) == [
        "Dockerfile",
        "serving-study",
        "variant",
        "verify_mm_utils.py",
        "wheelhouse",
    ]
    assert (context / "Dockerfile").read_bytes() == DOCKERFILE.read_bytes()
    # The manifest stays out: its timestamp would change the layer every time.
    assert sorted(path.name for path in (context / "wheelhouse").iterdir()) == [
        "requirements.txt",
        TORCH_WHEEL,
    ]
    assert (context / "serving-study/server-probe/sitecustomize.py").is_file()
    assert (context / "serving-study/stand-in/sgl_kernel/__init__.py").is_file()
    package = context / "variant/python/sglang"
    assert file_sha256(package / MM_UTILS) == variant["mm_utils_sha256"]
    # The server imports compiled extensions and data files, not only sources.
    assert [path.suffix for path in (package / "srt/rust_extensions").iterdir()] == [
        ".so"
    ]
    assert (package / "srt/configs/model.json").is_file()
    assert not list(context.rglob("__pycache__"))
    # The variant's python/ holds nothing but the package (the embedded image
    # takes the whole python/ tree; this one only the package).
    assert [path.name for path in (context / "variant/python").iterdir()] == ["sglang"]


def test_without_the_locks_wheelhouse_the_context_says_which_rule_makes_it(
    variant, python_path_directories, tmp_path
):
    with pytest.raises(ImageBuildFailed, match="rule wheelhouse_sglang_cpu"):
        cpu_context(variant, tmp_path / "none", python_path_directories, tmp_path / "c")


def test_a_missing_python_path_directory_fails_the_context(
    variant, lock_wheelhouse, python_path_directories, tmp_path
):
    shutil.rmtree(python_path_directories[0])
    with pytest.raises(ImageBuildFailed, match="server-probe does not exist"):
        cpu_context(
            variant, lock_wheelhouse, python_path_directories, tmp_path / "context"
        )
    with pytest.raises(ValueError, match="distinct names"):
        cpu_context(variant, lock_wheelhouse, [], tmp_path / "other")


def test_two_variants_contexts_differ_only_in_their_trees(
    variant, lock_wheelhouse, python_path_directories, tmp_path
):
    """What every layer before the variant's tree is built from (the Dockerfile,
    the wheels, the probe, the stand-in, the check, the build arguments but the
    variant's sha256) is the same for every variant: Docker's cache then shares
    those layers, as the embedded images show for real
    (tests/test_container_runtime.py)."""
    other_tree = tmp_path / "other/python"
    shutil.copytree(Path(variant["sglang_python_root"]), other_tree)
    (other_tree / "sglang" / MM_UTILS).write_text("# another transport\n")
    other = variant | {
        "name": "original",
        "mm_utils_sha256": file_sha256(other_tree / "sglang" / MM_UTILS),
        "sglang_python_root": str(other_tree),
    }
    contexts = [
        cpu_context(each, lock_wheelhouse, python_path_directories, tmp_path / name)
        for each, name in ((variant, "one"), (other, "two"))
    ]

    def shared_files(context: Path) -> dict[str, bytes]:
        return {
            path.relative_to(context).as_posix(): path.read_bytes()
            for path in sorted(context.rglob("*"))
            if path.is_file() and path.relative_to(context).parts[0] != "variant"
        }

    assert shared_files(contexts[0]) == shared_files(contexts[1])
    assert "wheelhouse/requirements.txt" in shared_files(contexts[0])
    trees = [context / "variant/python/sglang" / MM_UTILS for context in contexts]
    assert trees[0].read_bytes() != trees[1].read_bytes()
    arguments = [
        build_arguments("sglang-cpu", each, CONTAINER_SETTINGS)
        for each in (variant, other)
    ]
    differing = {key for key in arguments[0] if arguments[0][key] != arguments[1][key]}
    assert differing == {"MM_UTILS_SHA256"}


# --- The Dockerfile's layers --------------------------------------------------------


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) of each Dockerfile line, continuations joined."""
    joined = re.sub(r"\\\n", " ", dockerfile.read_text())
    parsed = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            parsed.append((keyword.upper(), rest.strip()))
    return parsed


def final_stage() -> list[tuple[str, str]]:
    steps = instructions(DOCKERFILE)
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def test_the_variants_tree_is_the_last_layer_and_nothing_before_depends_on_it():
    steps = final_stage()
    copies = [rest for keyword, rest in steps if keyword == "COPY"]
    assert copies[-1] == "variant/python/sglang /opt/variant/python/sglang"
    # Before the variant's tree: the venv, then the probe and the stand-in.
    assert copies[0] == "--from=packages /opt/venv /opt/venv"
    assert copies[1:3] == [
        "serving-study/server-probe /opt/serving-study/server-probe",
        "serving-study/stand-in /opt/serving-study/stand-in",
    ]
    variant_at = next(
        i for i, (keyword, rest) in enumerate(steps) if rest.startswith("variant/")
    )
    # Nothing per variant before it: no copy of the variant, no use of its sha256
    # (an ARG used by a RUN would change that RUN's cache key per variant).
    before = steps[:variant_at]
    assert not [
        rest for keyword, rest in before if keyword == "COPY" and "variant/" in rest
    ]
    assert not [rest for _, rest in before if "MM_UTILS_SHA256" in rest]
    after = [keyword for keyword, _ in steps[variant_at + 1 :]]
    assert after == ["ARG", "RUN"]  # one layer: the check, the import, bytecode
    # The wheels never reach the final image: only the venv is copied out.
    assert not any("wheelhouse" in rest for _, rest in steps)


def test_the_images_environment_is_the_cpu_platforms():
    env = " ".join(rest for keyword, rest in final_stage() if keyword == "ENV")
    python_path = re.search(r"PYTHONPATH=(\S+)", env).group(1).split(":")
    assert python_path == ["/opt/variant/python"] + [
        f"/opt/serving-study/{Path(name).name}"
        for name in CPU_PLATFORM.python_path_directories
    ]
    for variable, value in CPU_PLATFORM.environment.items():
        assert f"{variable}={value}" in env
    assert "PATH=/opt/venv/bin:$PATH" in env


def test_the_lock_is_installed_offline_and_closed():
    install = " ".join(
        rest for keyword, rest in instructions(DOCKERFILE) if "pip install" in rest
    )
    for option in ("--no-index", "--no-deps", "--only-binary=:all:"):
        assert option in install
    assert "--requirement /tmp/wheelhouse/requirements.txt" in install


# --- Build arguments, tag, labels -------------------------------------------------


def test_build_arguments_come_from_the_debian_base_settings(variant):
    assert build_arguments("sglang-cpu", variant, CONTAINER_SETTINGS) == {
        "MM_UTILS_SHA256": variant["mm_utils_sha256"],
        "BASE": BASE_IMAGE,
        "PYTHON_VERSION": "3.11",
    }


def test_the_tag_and_the_dockerfile_follow_the_platform(variant):
    kind = image_engine(CPU_PLATFORM)
    assert kind == "sglang-cpu" and image_engine(GPU_PLATFORM) == "sglang"
    assert image_tag(kind, "original") == "localhost/serving-study-sglang-cpu:original"
    assert ROOT / CPU_PLATFORM.dockerfile == DOCKERFILE
    for engine in ENGINES:
        assert (ROOT / f"envs/Dockerfile.{engine}").is_file()
    labels = image_labels(kind, variant)
    assert labels["serving-study.engine"] == "sglang-cpu"


# --- The closed lock's wheelhouse --------------------------------------------------


def test_a_closed_lock_pins_every_line():
    lines = [
        "# a comment",
        "",
        "torch==2.14.1 --hash=sha256:" + "1" * 64,
        "Jinja2==3.1.6 \\",
        "    --hash=sha256:" + "2" * 64 + "  # with a comment",
        "nvidia_cublas==13.1.1.3 \\",
        "    --hash=sha256:" + "0" * 64,
    ]
    assert lock_pins(lines) == {
        "torch": "2.14.1",
        "jinja2": "3.1.6",
        "nvidia-cublas": "13.1.1.3",
    }
    with pytest.raises(WheelhouseFailed, match="transformers>=5"):
        lock_pins(lines + ["transformers>=5"])
    with pytest.raises(WheelhouseFailed, match="numpy==2.4.6 carries no --hash"):
        lock_pins(lines + ["numpy==2.4.6"])
    with pytest.raises(WheelhouseFailed, match="lists no packages"):
        lock_pins(["# nothing"])


def test_a_closed_lock_downloads_without_dependencies_or_constraints(tmp_path):
    argv = download_command(
        requirements_file=tmp_path / "requirements.txt",
        constraints_file=None,
        dest=tmp_path,
        python_version="3.11",
        glibc_version="2.36",
    )
    assert "--no-deps" in argv and "--constraint" not in argv
    assert argv[argv.index("--python-version") + 1] == "3.11"
    assert argv[argv.index("--abi") + 1] == "cp311"
    assert "--only-binary=:all:" in argv


def test_the_wheels_must_match_the_lock_one_for_one():
    pins = {"torch": "2.14.1", "nvidia-cublas": "13.1.1.3"}
    cublas = Path("nvidia_cublas-13.1.1.3-py3-none-manylinux_2_27_x86_64.whl")
    refuse_wheels_off_the_lock([Path(TORCH_WHEEL), cublas], pins)
    with pytest.raises(WheelhouseFailed, match=r"missing \['nvidia-cublas'\]"):
        refuse_wheels_off_the_lock([Path(TORCH_WHEEL)], pins)
    with pytest.raises(WheelhouseFailed, match=r"not in the lock \['six'\]"):
        refuse_wheels_off_the_lock(
            [Path(TORCH_WHEEL), cublas, Path("six-1.17.0-py2.py3-none-any.whl")], pins
        )


# --- The workflow's plan -----------------------------------------------------------


def require_project_files():
    """The lock and the platform's directories are the project's; a missing one is
    a failure of the project, not a reason to skip."""
    missing = [
        name
        for name in (CPU_RUNTIME_LOCK, *CPU_PLATFORM.python_path_directories)
        if not (ROOT / name).exists()
    ]
    assert not missing, f"the CPU SGLang image needs {', '.join(missing)}"


def test_build_image_on_a_cpu_host_plans_the_locks_wheelhouse(tmp_path):
    require_project_files()
    finished = subprocess.run(
        snakemake_command(
            tmp_path,
            "-n",
            "results/test-sglang-cpu-docker/images/original.iid",
            "results/test-sglang-cpu-docker/images/patched.iid",
            config=CPU_DOCKER_CONFIG,
        ),
        capture_output=True,
        text=True,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    planned = finished.stdout + finished.stderr
    assert re.search(r"\bwheelhouse_sglang_cpu\s+1\b", planned), planned
    assert re.search(r"\bbuild_image\s+2\b", planned), planned
    assert not re.search(r"\bwheelhouse\s+1\b", planned), planned


# --- A real image (Docker) ------------------------------------------------------------


# The arm the container study serves, and the one variant whose image it builds: the
# patched one, so that the image built for real holds a tree with its patch applied.
# A second variant's image would cost the suite its 3 GB context and the check again
# (about 80 s) and show only what two variants' contexts (above) and the embedded
# images' shared layers (tests/test_container_runtime.py) already show.
SERVED_ARM = "patched"


@pytest.fixture(scope="module")
def container_study(docker_engine, tmp_path_factory) -> Path:
    """The test study with its patched arm alone: the lock's wheelhouse and that
    variant's image built by the workflow's rules, and the arm served by
    `docker run --cpus` of the image."""
    require_project_files()
    workdir = tmp_path_factory.mktemp("sglang-cpu-images")
    arms = yaml.safe_load(CPU_DOCKER_CONFIG.read_text())["arms"]
    one_arm = workdir.parent / "sglang-cpu-docker-one-arm.yaml"
    one_arm.write_text(
        yaml.safe_dump(
            {
                "arms": [arm for arm in arms if arm["name"] == SERVED_ARM],
                "claims": [],
            }
        )
    )
    finished = subprocess.run(
        snakemake_command(
            workdir, "--cores", "2", "all", config=(CPU_DOCKER_CONFIG, one_arm)
        ),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    # The wheelhouse is gigabytes: it is not kept with the test's files.
    for wheelhouse in (workdir / "resources").glob("wheelhouse-sglang-cpu-*"):
        shutil.rmtree(wheelhouse, ignore_errors=True)
    logs = "".join(
        path.read_text(errors="replace")[-3000:]
        for path in sorted((workdir / "results/logs").rglob("*.log"))
    )
    assert finished.returncode == 0, finished.stderr[-3000:] + logs
    return workdir


def image_of(workdir: Path, variant: str) -> dict:
    return json.loads(
        (
            workdir / f"results/test-sglang-cpu-docker/images/{variant}.inspect.json"
        ).read_text()
    )


@pytest.mark.docker
@pytest.mark.slow
def test_only_the_served_variants_image_is_built(container_study):
    images = container_study / "results/test-sglang-cpu-docker/images"
    assert sorted(path.name for path in images.glob("*.iid")) == [f"{SERVED_ARM}.iid"]


@pytest.mark.docker
@pytest.mark.slow
def test_the_image_imports_its_variants_patched_mm_utils_from_the_variants_tree(
    container_study,
):
    variant = json.loads(
        (
            container_study
            / f"results/test-sglang-cpu-docker/variants/{SERVED_ARM}.json"
        ).read_text()
    )
    # The patch was applied to the tree the image holds: its mm_utils.py is not
    # the release's.
    (release_mm_utils,) = (container_study / "resources/sources").glob(
        f"{variant['source']['name']}-*/tree/python/sglang/{MM_UTILS}"
    )
    assert variant["patch"]["sha256"]
    assert variant["mm_utils_sha256"] != file_sha256(release_mm_utils)
    image = image_of(container_study, SERVED_ARM)
    labels = image["Config"]["Labels"]
    assert labels["serving-study.engine"] == "sglang-cpu"
    assert labels["serving-study.patch-sha256"] == variant["patch"]["sha256"]
    assert "SGLANG_USE_CPU_ENGINE=1" in image["Config"]["Env"]
    imported = docker(
        "run",
        "--rm",
        "--network=none",
        image["Id"],
        "python3",
        "-c",
        "import sglang.srt.managers.mm_utils as m, sgl_kernel; "
        "print(m.__file__); print(sgl_kernel.__file__)",
    )
    mm_utils, stand_in = imported.stdout.split()
    assert mm_utils == f"/opt/variant/python/sglang/{MM_UTILS}"
    assert stand_in == "/opt/serving-study/stand-in/sgl_kernel/__init__.py"
    # The load probe, on the path in the image, reports the variant's file.
    probe = re.search(r"serving-study loaded: (\{.*\})", imported.stderr)
    assert probe, imported.stderr
    assert json.loads(probe.group(1))["sha256"] == variant["mm_utils_sha256"]


@pytest.mark.docker
@pytest.mark.slow
def test_the_real_server_serves_its_arm_in_its_container(container_study):
    results = container_study / "results/test-sglang-cpu-docker"
    arm = SERVED_ARM
    run = results / arm / "run1"
    metrics = json.loads((run / "metrics.json").read_text())
    provenance = json.loads((run / "provenance.json").read_text())
    assert metrics["valid"], metrics["invalid_reasons"]
    argv = provenance["runtime_argv"]
    assert_ran_as_planned(container_study, "test-sglang-cpu-docker", arm)
    assert argv[:2] == ["docker", "run"] and "sglang.launch_server" in argv
    assert "--gpus" not in argv
    assert any(item.endswith(":ro") for item in argv)  # the model, read-only
    assert provenance["quota_seen_inside"]["cores"] == pytest.approx(1.5)
    checks = metrics["checks"]
    assert checks["transport_seen"] == "cpu"
    assert checks["mm_utils_sha256_loaded"] == provenance["variant"]["mm_utils_sha256"]
    assert checks["mm_utils_loaded_from"].startswith("/opt/variant/python/")
    assert checks["stand_in_placeholders_called"] == []
    assert (results / "report.html").is_file()
    left = docker("ps", "-aq", "--filter", "label=serving-study.run", check=False)
    assert left.stdout.strip() == ""
