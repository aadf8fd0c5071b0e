"""Fixtures shared across test files: the real SGLang 0.5.23 source, fetched once;
the CPU server runtime, built once; a Docker engine that answers, or a skip."""

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from study_helpers import STUDY_SECRETS, docker, snakemake_command

from serving_study.config.platform import CPU_RUNTIME_LOCK
from serving_study.sources.fetch import fetch_source
from serving_study.sources.images import engine_answers
from serving_study.sources.sglang_runtime import ensure_sglang_runtime

ROOT = Path(__file__).resolve().parents[1]
# The Debian base every locally built image starts from (.ci/container-engine.sh).
BASE_IMAGE = "localhost/bookworm-minbase:latest"

# The release as the shipped config pins it: by the sha256 of each of its wheels.
SGLANG_0_5_23 = {
    source["name"]: source
    for source in yaml.safe_load((ROOT / "config/config.yaml").read_text())["sources"]
}["sglang-0.5.23"]


# Fixtures that download from a package index the first time (then kept in pytest's
# cache), and whole-workflow tests, whose fetch_source rule downloads the release.
DOWNLOADING_FIXTURES = {
    "sglang_0_5_23",
    "transport_sources_0_5_23",
    "sglang_cpu_runtime",
}
# Modules whose tests run this workflow's fetch_source rule, which downloads.
WORKFLOW_MODULES = {
    "test_workflow_run",
    "test_workflow_sglang_cpu",
    "test_workflow_interrupt",
    "test_workflow_faults",
    "test_workflow_killed_runner",
}


def pytest_collection_modifyitems(config, items):
    """Each test says what it needs: ``network`` when it downloads (directly or
    through a fixture), ``sglang_runtime`` when it runs the real server's runtime."""
    for item in items:
        needed = set(getattr(item, "fixturenames", ()))
        module = item.module.__name__ if item.module else ""
        if needed & DOWNLOADING_FIXTURES or module in WORKFLOW_MODULES:
            item.add_marker(pytest.mark.network)
        if "sglang_cpu_runtime" in needed:
            item.add_marker(pytest.mark.sglang_runtime)


@pytest.fixture(scope="session")
def sglang_0_5_23(pytestconfig) -> tuple[Path, dict]:
    """The real sglang 0.5.23 source tree and its identity (kept between runs, and
    checked file by file each time it is reused)."""
    tree = pytestconfig.cache.mkdir("sglang-sources") / "sglang-0.5.23"
    wheels = pytestconfig.cache.mkdir("sglang-wheels")
    return tree, fetch_source(SGLANG_0_5_23, tree, download_dir=wheels)


@pytest.fixture(scope="session")
def sglang_cpu_runtime(pytestconfig) -> dict:
    """The real server's CPU runtime from envs/sglang-cpu/requirements.lock (~6.6
    GB, built once and kept in pytest's cache; rebuilt when the lock changes)."""
    destination = pytestconfig.cache.mkdir("sglang-runtime")
    return ensure_sglang_runtime(
        ROOT / CPU_RUNTIME_LOCK, destination, progress=lambda message: None
    )


# The two files the embedded engine loads the transport class from.
TRANSPORT_FILES = (
    "sglang/srt/managers/mm_utils.py",
    "sglang/srt/utils/stale_shm_cleanup.py",
)
ORIGINAL_COPY = """\
            dst = torch.frombuffer(shm.buf, dtype=torch.uint8)
            dst.copy_(tensor.view(torch.uint8).reshape(-1))
"""
PR_48881_COPY = """\
            shm.buf[:] = tensor.detach().view(torch.uint8).reshape(-1).numpy()
"""


def release_transport_sources(pytestconfig, version: str, destination: Path) -> Path:
    """A folder holding just the transport files of SGLang ``version`` (from PyPI,
    cached between runs): what the engine needs as ``--sglang-source``."""
    tree = pytestconfig.cache.mkdir("sglang-sources") / f"sglang-{version}"
    record = {
        "name": f"sglang-{version}",
        "pypi": {"package": "sglang", "version": version},
    }
    fetch_source(record, tree, download_dir=pytestconfig.cache.mkdir("sglang-wheels"))
    for relative in TRANSPORT_FILES:
        source = tree / "python" / relative
        if source.exists():
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    return destination


@pytest.fixture(scope="session")
def transport_sources_0_5_23(pytestconfig, tmp_path_factory) -> Path:
    destination = tmp_path_factory.mktemp("sglang-0.5.23")
    return release_transport_sources(pytestconfig, "0.5.23", destination)


@pytest.fixture(scope="session")
def transport_sources_0_5_23_patched(transport_sources_0_5_23, tmp_path_factory):
    """The same files with PR #48881's copy in place of torch's copy_()."""
    patched = tmp_path_factory.mktemp("sglang-0.5.23-pr48881")
    for relative in TRANSPORT_FILES:
        target = patched / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((transport_sources_0_5_23 / relative).read_text())
    mm_utils = patched / TRANSPORT_FILES[0]
    text = mm_utils.read_text()
    assert text.count(ORIGINAL_COPY) == 1
    mm_utils.write_text(text.replace(ORIGINAL_COPY, PR_48881_COPY))
    return patched


@pytest.fixture(scope="session")
def docker_engine():
    """Skip unless a Docker engine answers and holds the local base image."""
    problem = engine_answers("docker")
    if problem:
        pytest.skip(
            f"no Docker engine answers ({problem}; DOCKER_HOST="
            f"{os.environ.get('DOCKER_HOST', 'unset')}): run "
            '`engine_env=$(.ci/container-engine.sh start) && eval "$engine_env"`'
        )
    if docker("image", "inspect", BASE_IMAGE, check=False).returncode != 0:
        pytest.skip(f"the base image {BASE_IMAGE} is missing: .ci/container-engine.sh")


@pytest.fixture(scope="session")
def docker_study(docker_engine, tmp_path_factory) -> Path:
    """config/test/docker.yaml run for real by Snakemake: two images, two arms, the
    first arm passing STUDY_SECRETS to its server by name. The container tests
    (tests/test_container_runtime.py) and the secrets tests (tests/test_secrets.py)
    read the one study; Snakemake's output is kept in it as snakemake.out."""
    workdir = tmp_path_factory.mktemp("docker-study")
    config = ROOT / "config/test/docker.yaml"
    arms = yaml.safe_load(config.read_text())["arms"]
    arms[0] |= {"secret_environment": sorted(STUDY_SECRETS)}
    with_secrets = workdir.parent / "docker-study-secrets.yaml"
    with_secrets.write_text(yaml.safe_dump({"arms": arms}))
    finished = subprocess.run(
        snakemake_command(
            workdir, "--cores", "2", "all", config=(config, with_secrets)
        ),
        capture_output=True,
        text=True,
        timeout=1800,
        env=os.environ | STUDY_SECRETS,
    )
    (workdir / "snakemake.out").write_text(finished.stdout + finished.stderr)
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-4000:]
    return workdir
