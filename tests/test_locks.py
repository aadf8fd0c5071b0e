"""The hashed locks install exactly what the requirements pin, and nothing unhashed."""

from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from serving_study.sources.hashed_lock import canonical_name, read_hashed_lock

ROOT = Path(__file__).resolve().parents[1]


def pins(requirements: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` line, following ``-r`` includes."""
    found = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            found |= pins(requirements.parent / line[3:].strip())
        elif "==" in line:
            name, version = line.split("==")
            found[canonical_name(name.split("[")[0])] = version.strip()
    return found


def locked(lock: Path) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (version, sha256 digests) of every entry; the reader refuses an
    entry without a hash."""
    packages = read_hashed_lock(lock.read_text(), lock.name)
    return {
        name: (package.version, package.sha256) for name, package in packages.items()
    }


@pytest.mark.parametrize(
    ("requirements", "lock"),
    [
        ("requirements.txt", "envs/workflow.lock"),
        ("requirements-test.txt", "envs/test.lock"),
    ],
)
def test_every_pin_is_locked_at_its_version(requirements, lock):
    entries = locked(ROOT / lock)
    for name, version in pins(ROOT / requirements).items():
        assert name in entries, f"{requirements} pins {name}, {lock} lacks it"
        locked_version = Version(entries[name][0]).public
        assert locked_version == version, (
            f"{name}: {requirements} {version}, {lock} {locked_version}"
        )


def test_the_test_lock_holds_the_workflow_lock_unchanged():
    workflow, test = (
        locked(ROOT / "envs/workflow.lock"),
        locked(ROOT / "envs/test.lock"),
    )
    assert {name: test.get(name) for name in workflow} == workflow


def test_the_quick_start_installs_from_the_locks_with_hashes_required():
    readme = (ROOT / "README.md").read_text()
    for lock in ("envs/workflow.lock", "envs/test.lock"):
        assert f"pip install --require-hashes -r {lock}" in readme


def test_the_conda_environment_of_every_rule_is_the_workflow_lock():
    """Snakemake copies envs/workflow.yaml before conda reads it, so the file holds
    the lock's lines itself (lock_requirements.py writes both)."""
    environment = yaml.safe_load((ROOT / "envs/workflow.yaml").read_text())
    dependencies = environment["dependencies"]
    assert "python=3.11" in dependencies
    (pip_section,) = [entry for entry in dependencies if isinstance(entry, dict)]
    options = [line for line in pip_section["pip"] if line.startswith("--")]
    assert options == ["--extra-index-url https://download.pytorch.org/whl/cpu"]
    requirements = "\n".join(
        line for line in pip_section["pip"] if not line.startswith("--")
    )
    as_conda_installs = read_hashed_lock(requirements, "envs/workflow.yaml")
    assert as_conda_installs == read_hashed_lock(
        (ROOT / "envs/workflow.lock").read_text(), "envs/workflow.lock"
    )


@pytest.mark.parametrize(
    ("gpu_host_lock", "source_lock"),
    [
        ("envs/sglang-gpu-host/requirements.lock", "envs/sglang-cpu/requirements.lock"),
        ("envs/sglang-gpu-host/workflow.lock", "envs/workflow.lock"),
    ],
)
def test_the_gpu_host_locks_pin_the_project_locks_versions(gpu_host_lock, source_lock):
    """What the GPU host lacks (envs/lock_gpu_host.py) is installed at the versions
    the project runs elsewhere, never another resolution."""
    ours, source = locked(ROOT / gpu_host_lock), locked(ROOT / source_lock)
    assert ours, gpu_host_lock
    for name, (version, _) in ours.items():
        assert name in source, f"{gpu_host_lock} pins {name}, {source_lock} lacks it"
        assert version == source[name][0], f"{name}: {version} != {source[name][0]}"


def test_the_gpu_host_server_lock_leaves_out_what_the_host_has():
    """The host's torch is the one the server runs with (the deviation the report
    names), and neither sglang nor a CUDA library comes from the lock."""
    ours = locked(ROOT / "envs/sglang-gpu-host/requirements.lock")
    assert not {"torch", "torchvision", "triton", "sglang"} & set(ours)
    assert not [name for name in ours if name.startswith(("nvidia-", "cuda-"))]
    assert {"transformers", "fastapi", "pyzmq", "xgrammar"} <= set(ours)
