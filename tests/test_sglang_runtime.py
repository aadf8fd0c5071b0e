"""The CPU runtime of real SGLang: the lock is closed and holds no sglang; the venv
is built from a lock, reused only for that very lock and only when complete; the
sgl-kernel stand-in and the mm_utils load probe behave as the server's log checks
expect.

The build tests install a one-package lock (six, from the local mirror) for real. The
slow tests build the whole runtime once (kept in pytest's cache between runs) and
import the stand-in in it; one also calls SGLang 0.5.23's own caller of
``assign_req_to_token_pool_cpu``.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PIL import Image

from serving_study.config.platform import CPU_PLATFORM, python_path
from serving_study.measure.server_log_facts import GC_RESUMED_LINE
from serving_study.sources import sglang_runtime
from serving_study.sources.hashed_lock import logical_lines
from serving_study.sources.recorded_files import RecordedFileChanged
from serving_study.sources.runtime_python import SYSTEM_PYTHON, base_python
from serving_study.sources.sglang_runtime import (
    RuntimeBuildError,
    ensure_sglang_runtime,
    read_lock,
    runtime_record,
)
from serving_study.sources.tiny_model import write_tiny_qwen3_vl
from serving_study.sources.tiny_model_settings import TinyModelSettings
from serving_study.studies.main_process_steps import measure_main_process_steps

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "envs" / "sglang-cpu" / "requirements.lock"
STAND_IN = ROOT / "envs" / "sglang-cpu" / "stand-in"
PROBE = ROOT / "envs" / "server-probe"
PROBED_MODULE = "sglang.srt.managers.mm_utils"
LOADED_PREFIX = "serving-study loaded: "
STAND_IN_LINE = re.compile(
    r"^serving-study stand-in: (?P<placeholder>placeholder )?(?P<op>\S+) "
    r"called in pid (?P<pid>\d+) \((?P<title>.*)\)$"
)
# sglang's own requirements that only a GPU uses; none may come in through the lock.
GPU_ONLY = (
    "flashinfer-python",
    "sglang-kernel",
    "sgl-deep-ep",
    "sgl-deep-gemm",
    "sgl-flash-mla",
    "flash-attn-4",
    "torchcodec",
    "torchaudio",
    "nvidia-cutlass-dsl",
    "humming-kernels",
)


# --- The lock -------------------------------------------------------------------


def test_the_lock_pins_every_package_and_holds_no_sglang():
    pins = read_lock(LOCK)
    requirements = [requirement for _, requirement in logical_lines(LOCK.read_text())]
    assert len(requirements) == len(pins), "a package is listed twice"
    assert all(
        re.fullmatch(r"[A-Za-z0-9._-]+==\S+ --hash=sha256:[0-9a-f]{64}", requirement)
        for requirement in requirements
    )
    assert [r.split()[0] for r in requirements[:2]] == [
        "torch==2.14.1",
        "torchvision==0.29.1",
    ]
    assert pins["transformers"] == "5.19.0"
    assert "sglang" not in pins
    assert not set(GPU_ONLY) & set(pins)
    assert not {"pip", "setuptools"} & set(pins)


@pytest.mark.parametrize(
    "line, complaint",
    [
        ("six>=1.16", "not pinned"),
        ("six==1.17.0; python_version > '3'", "not pinned"),
        ("--index-url https://example.invalid/simple", "not pinned"),
        ("sglang==0.5.23 --hash=sha256:" + "1" * 64, "sglang is pinned"),
        ("idna==3.11", "carries no --hash"),
    ],
)
def test_a_lock_that_is_not_closed_is_refused(tmp_path, line, complaint):
    lock = tmp_path / "requirements.lock"
    hashed_six = "six==1.17.0 \\\n    --hash=sha256:" + "0" * 64
    lock.write_text(f"# a comment\n{hashed_six}\n{line}\n")
    with pytest.raises(RuntimeBuildError, match=complaint):
        read_lock(lock)


# --- Building and reusing the venv ------------------------------------------------


# six 1.17.0's one wheel, as PyPI lists it.
SIX_WHEEL_SHA256 = "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"


@pytest.fixture
def six_lock(tmp_path, monkeypatch) -> Path:
    """A closed one-package lock beside a copy of the stand-in, as in envs/."""
    lock_directory = tmp_path / "envs"
    (lock_directory / "stand-in" / "sgl_kernel").mkdir(parents=True)
    (lock_directory / "stand-in" / "sgl_kernel" / "__init__.py").write_text("")
    lock = lock_directory / "requirements.lock"
    lock.write_text(f"# test lock\nsix==1.17.0 --hash=sha256:{SIX_WHEEL_SHA256}\n")
    monkeypatch.setattr(sglang_runtime, "RECORDED_PACKAGES", ("torch", "six"))
    return lock


def build(lock: Path, dest: Path) -> tuple[dict, list[str]]:
    messages: list[str] = []
    record = ensure_sglang_runtime(lock, dest, progress=messages.append)
    return record, messages


def test_a_build_installs_the_lock_and_records_it(six_lock, tmp_path):
    dest = tmp_path / "runtime"
    record, messages = build(six_lock, dest)

    python = dest / "venv" / "bin" / "python"
    assert record == runtime_record(dest)
    assert record["python"] == str(python)
    assert record["lock_file"] == str(six_lock)
    assert record["lock_sha256"] == hashlib.sha256(six_lock.read_bytes()).hexdigest()
    assert record["packages"] == {"six": "1.17.0"}
    assert record["stand_in"] == str(six_lock.parent / "stand-in")
    assert record["python_version"].startswith("{}.{}.".format(*sys.version_info))
    assert any(message.startswith("pip: ") for message in messages)
    imported = subprocess.run(
        [str(python), "-c", "import six, sys; print(six.__version__, sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.split() == ["1.17.0", str(dest / "venv")]
    # Built in venv.partial-<pid> and renamed: nothing names the old directory.
    assert not list(dest.glob("venv.partial-*"))
    for file in (dest / "venv" / "bin" / "pip", dest / "venv" / "bin" / "activate"):
        assert "venv.partial-" not in file.read_text()
    assert "venv.partial-" not in (dest / "venv" / "pyvenv.cfg").read_text()


def test_the_same_lock_reuses_the_venv_and_a_changed_lock_rebuilds_it(
    six_lock, tmp_path
):
    dest = tmp_path / "runtime"
    first, _ = build(six_lock, dest)
    # Bytecode is not among the venv's recorded files (Python writes it as it
    # imports), so a sentinel there does not stop the reuse.
    sentinel = dest / "venv" / "__pycache__" / "sentinel.pyc"
    sentinel.parent.mkdir()
    sentinel.write_text("from the first build")

    again, messages = build(six_lock, dest)
    assert again == first
    assert sentinel.exists()
    assert not any(message.startswith("pip: ") for message in messages)

    # Snakemake deletes a job's output before running it: still reused.
    (dest / "runtime.json").unlink()
    assert build(six_lock, dest)[0] == first
    assert runtime_record(dest) == first

    # Any change to the lock's bytes is a different lock.
    six_lock.write_text(six_lock.read_text() + "# edited\n")
    rebuilt, messages = build(six_lock, dest)
    assert rebuilt["lock_sha256"] != first["lock_sha256"]
    assert not sentinel.exists()
    assert any(message.startswith("pip: ") for message in messages)


def test_the_base_is_the_systems_python_of_the_locks_version_or_this_one(tmp_path):
    assert base_python(tmp_path / "missing") == Path(sys.executable)
    other_version = tmp_path / "python3.11"
    other_version.write_text("#!/bin/sh\necho 3.12\n")
    other_version.chmod(0o755)
    assert base_python(other_version) == Path(sys.executable)
    without_venv = tmp_path / "python-without-venv"
    without_venv.write_text("#!/bin/sh\nexit 1\n")
    without_venv.chmod(0o755)
    assert base_python(without_venv) == Path(sys.executable)


@pytest.mark.skipif(
    base_python() != SYSTEM_PYTHON,
    reason=f"this host has no {SYSTEM_PYTHON} with venv",
)
def test_the_venv_is_made_from_the_systems_python_and_rebuilt_for_another_base(
    six_lock, tmp_path
):
    dest = tmp_path / "runtime"
    built, _ = build(six_lock, dest)
    assert built["base_python"] == str(SYSTEM_PYTHON)
    base_prefix = subprocess.run(
        [built["python"], "-c", "import sys; print(sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert base_prefix == "/usr"

    messages: list[str] = []
    rebuilt = ensure_sglang_runtime(
        six_lock, dest, progress=messages.append, base=Path(sys.executable)
    )
    assert rebuilt["base_python"] == sys.executable
    assert any(message.startswith("pip: ") for message in messages)


def test_a_changed_file_of_a_reused_venv_is_named(six_lock, tmp_path):
    dest = tmp_path / "runtime"
    build(six_lock, dest)
    (module,) = (dest / "venv").glob("lib/python*/site-packages/six.py")
    recorded = hashlib.sha256(module.read_bytes()).hexdigest()
    module.write_text(module.read_text() + "# edited in place\n")

    with pytest.raises(RecordedFileChanged) as raised:
        build(six_lock, dest)

    changed = hashlib.sha256(module.read_bytes()).hexdigest()
    assert str(raised.value) == (
        f"{module} changed since it was recorded (sha256 {recorded} -> {changed}); "
        f"remove {dest / 'venv'} to build it again"
    )


def test_a_venv_built_before_files_were_recorded_has_them_recorded_on_reuse(
    six_lock, tmp_path
):
    dest = tmp_path / "runtime"
    first, _ = build(six_lock, dest)
    files = dest / "venv" / "files.json"
    recorded = json.loads(files.read_text())
    files.unlink()

    again, messages = build(six_lock, dest)

    assert again == first
    assert json.loads(files.read_text()) == recorded
    assert any("predates its record of files" in message for message in messages)
    (dest / "venv" / "bin" / "extra-tool").write_text("#!/bin/sh\n")
    with pytest.raises(RecordedFileChanged, match="extra-tool was added since"):
        build(six_lock, dest)


def test_a_half_built_or_broken_venv_is_never_reused(six_lock, tmp_path):
    dest = tmp_path / "runtime"
    build(six_lock, dest)

    # A venv whose record is missing (the build died before writing it).
    (dest / "venv" / "runtime.json").unlink()
    (dest / "venv" / "sentinel").write_text("half built")
    build(six_lock, dest)
    assert not (dest / "venv" / "sentinel").exists()

    # A record whose Python no longer runs.
    (dest / "venv" / "bin" / "python").unlink()
    build(six_lock, dest)
    assert (dest / "venv" / "bin" / "python").exists()


def test_a_dead_builds_partial_venv_is_removed(six_lock, tmp_path):
    dest = tmp_path / "runtime"
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = dest / f"venv.partial-{dead.pid}"
    (leftover / "bin").mkdir(parents=True)
    build(six_lock, dest)
    assert not leftover.exists()


def test_a_pip_failure_names_the_package_and_leaves_nothing_built(six_lock, tmp_path):
    dest = tmp_path / "runtime"
    six_lock.write_text(f"six==0.0.0 --hash=sha256:{SIX_WHEEL_SHA256}\n")
    with pytest.raises(RuntimeBuildError) as raised:
        build(six_lock, dest)
    message = str(raised.value)
    assert "six==0.0.0" in message
    assert "pip install" in message and "--no-deps" in message
    assert "fix the package named above in the lock" in message
    assert not (dest / "runtime.json").exists()
    assert not (dest / "venv").exists()
    assert not list(dest.glob("venv.partial-*"))
    with pytest.raises(RuntimeBuildError, match="build the runtime first"):
        runtime_record(dest)


# --- The mm_utils load probe --------------------------------------------------------


def fake_mm_utils(root: Path) -> Path:
    """A package tree holding a stand-in ``sglang.srt.managers.mm_utils``."""
    module = root / "sglang" / "srt" / "managers" / "mm_utils.py"
    module.parent.mkdir(parents=True)
    for package in (module.parents[0], module.parents[1], module.parents[2]):
        (package / "__init__.py").write_text("")
    module.write_text("MARKER = 'fake mm_utils'\n")
    return module


def probe_lines(stderr: str) -> list[dict]:
    return [
        json.loads(line.removeprefix(LOADED_PREFIX))
        for line in stderr.splitlines()
        if line.startswith(LOADED_PREFIX)
    ]


def run_with_probe(
    arguments: list[str], tree: Path, **variables: str
) -> subprocess.CompletedProcess:
    """Run this Python in ``tree`` with the tree and the probe on PYTHONPATH (and
    ``variables`` set)."""
    environment = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{PROBE}")
    environment.update(variables)
    return subprocess.run(
        [sys.executable, *arguments],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tree,
        check=True,
    )


def test_the_probe_reports_the_module_once_and_changes_nothing_else(tmp_path):
    module = fake_mm_utils(tmp_path)
    finished = run_with_probe(
        [
            "-c",
            textwrap.dedent(
                """
        import importlib.machinery, json, os, sys
        import sglang.srt.managers.mm_utils as mm_utils
        import sglang.srt.managers.mm_utils
        print(json.dumps({
            "marker": mm_utils.MARKER,
            "loader": type(mm_utils.__loader__).__name__,
            "torch_imported": "torch" in sys.modules,
            "pid": os.getpid(),
        }))
        """
            ),
        ],
        tmp_path,
    )
    facts = json.loads(finished.stdout)
    (line,) = probe_lines(finished.stderr)
    assert line == {
        "module": PROBED_MODULE,
        "file": str(module),
        "sha256": hashlib.sha256(module.read_bytes()).hexdigest(),
        "pid": facts["pid"],
        "title": line["title"],
        "torch_threads": None,
        # The thread knobs the process saw: this test's own, inherited.
        "environment": {
            name: value
            for name, value in sorted(os.environ.items())
            if name.startswith(("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH_"))
        },
    }
    assert "-c" in line["title"]
    assert facts == {
        "marker": "fake mm_utils",
        "loader": "SourceFileLoader",
        "torch_imported": False,
        "pid": facts["pid"],
    }


def test_the_probe_reports_the_arms_variables_and_only_the_presence_of_its_secrets(
    tmp_path,
):
    # SGLang's process titles overwrite /proc/<pid>/environ: the runner reads the
    # arm's variables from this report instead.
    fake_mm_utils(tmp_path)
    secret = "s3cr3t-value-0123456789"
    finished = run_with_probe(
        ["-c", "import sglang.srt.managers.mm_utils"],
        tmp_path,
        SERVING_STUDY_REPORT_VARIABLES="ARM_KNOB,ARM_UNSET",
        SERVING_STUDY_REPORT_PRESENCE="ARM_PASSED_TOKEN,ARM_MISSING_TOKEN",
        ARM_KNOB="on",
        ARM_PASSED_TOKEN=secret,
    )
    (line,) = probe_lines(finished.stderr)
    reported = line["environment"]
    assert reported["ARM_KNOB"] == "on" and reported["ARM_UNSET"] is None
    assert reported["ARM_PASSED_TOKEN"] == "<set>"
    assert reported["ARM_MISSING_TOKEN"] is None
    assert secret not in finished.stderr + finished.stdout


def test_the_probe_reports_from_a_spawned_process(tmp_path):
    module = fake_mm_utils(tmp_path)
    (tmp_path / "spawned.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing, os

            def load():
                import sglang.srt.managers.mm_utils  # noqa: F401
                print(os.getpid(), flush=True)

            if __name__ == "__main__":
                child = multiprocessing.get_context("spawn").Process(target=load)
                child.start()
                child.join()
            """
        )
    )
    finished = run_with_probe(["spawned.py"], tmp_path)
    (line,) = probe_lines(finished.stderr)
    assert line["pid"] == int(finished.stdout.split()[-1])
    assert line["file"] == str(module)


def test_the_collector_is_paused_only_when_asked_and_resumes_at_the_first_freeze(
    tmp_path,
):
    script = textwrap.dedent(
        """
        import gc, json, weakref
        class Junk:
            pass
        before = {"enabled": gc.isenabled(), "freeze": gc.freeze.__name__}
        junk = Junk()
        junk.itself = junk  # a cycle only the collector frees
        alive = weakref.ref(junk)
        del junk
        gc.freeze()
        after = {"enabled": gc.isenabled(), "freeze": gc.freeze.__name__}
        kept = alive() is not None  # frozen as it was, not collected first
        gc.freeze()
        frozen = gc.get_freeze_count()
        print(json.dumps(
            {"before": before, "after": after, "kept": kept, "frozen": frozen}
        ))
        """
    )
    asked = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=dict(
            os.environ, PYTHONPATH=str(PROBE), SERVING_STUDY_PAUSE_GC_AT_START="1"
        ),
        check=True,
    )
    facts = json.loads(asked.stdout)
    assert facts["before"] == {"enabled": False, "freeze": "freeze_then_resume"}
    assert facts["after"] == {"enabled": True, "freeze": "freeze"}
    assert facts["kept"] is True
    assert facts["frozen"] > 0
    resumed = [line for line in asked.stderr.splitlines() if "gc resumed" in line]
    assert len(resumed) == 1 and GC_RESUMED_LINE.fullmatch(resumed[0])

    untouched = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(PROBE)),
        check=True,
    )
    facts = json.loads(untouched.stdout)
    assert facts["before"] == {"enabled": True, "freeze": "freeze"}
    assert "gc resumed" not in untouched.stderr


# --- The built runtime and the sgl-kernel stand-in (slow) ---------------------------


@pytest.fixture(scope="session")
def built_runtime(sglang_cpu_runtime) -> dict:
    """The real runtime from envs/sglang-cpu/requirements.lock (conftest.py)."""
    return sglang_cpu_runtime


def run_in_runtime(
    record: dict, code: str, *python_path: Path, environment: dict | None = None
) -> subprocess.CompletedProcess:
    directories = (*python_path, PROBE, STAND_IN)
    path = os.pathsep.join(str(directory) for directory in directories)
    return subprocess.run(
        [record["python"], "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=path, **(environment or {})),
        check=False,
        timeout=600,
    )


@pytest.mark.slow
def test_the_runtime_has_the_locked_packages(built_runtime):
    assert built_runtime["packages"]["torch"] == "2.14.1"
    assert built_runtime["packages"]["transformers"] == "5.19.0"
    finished = run_in_runtime(
        built_runtime,
        """
        import importlib.util, torch, transformers
        assert importlib.util.find_spec("sglang") is None, "sglang is installed"
        print(torch.__version__)
        """,
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip().startswith("2.14.1")


@pytest.mark.slow
def test_the_stand_in_registers_placeholders_that_raise_and_say_so(built_runtime):
    finished = run_in_runtime(
        built_runtime,
        """
        import json, os, torch
        import sgl_kernel
        from sgl_kernel import PLACEHOLDER_FUNCTIONS, PLACEHOLDER_OPS
        ops = torch.ops.sgl_kernel
        facts = {
            "pid": os.getpid(),
            "ops": [hasattr(ops, name) for name in PLACEHOLDER_OPS],
            "functions": [
                callable(getattr(sgl_kernel, name)) for name in PLACEHOLDER_FUNCTIONS
            ],
            "convert_weight_packed": hasattr(ops, "convert_weight_packed"),
            "module_has_it": hasattr(sgl_kernel, "convert_weight_packed"),
        }
        try:
            torch.ops.sgl_kernel.fused_sigmoid_mul_cpu(torch.ones(2), torch.ones(2))
        except NotImplementedError as error:
            facts["raised"] = str(error)
        print(json.dumps(facts))
        """,
    )
    assert finished.returncode == 0, finished.stderr
    facts = json.loads(finished.stdout)
    assert all(facts["ops"]) and len(facts["ops"]) == 4
    assert all(facts["functions"])
    assert facts["convert_weight_packed"] is False
    assert facts["module_has_it"] is False
    assert "placeholder" in facts["raised"]
    (line,) = [line for line in finished.stderr.splitlines() if "stand-in" in line]
    match = STAND_IN_LINE.match(line)
    assert match is not None, line
    assert match["placeholder"] and match["op"] == "fused_sigmoid_mul_cpu"
    assert int(match["pid"]) == facts["pid"]


ASSIGN_EXAMPLE = """
    import torch
    req_to_token = torch.full((4, 8), -1, dtype=torch.int32)
    req_pool_indices = torch.tensor([2, 0, 3], dtype=torch.int64)
    start_offset = torch.tensor([1, 0, 5], dtype=torch.int64)
    end_offset = torch.tensor([4, 2, 5], dtype=torch.int64)
    out_cache_loc = torch.tensor([10, 11, 12, 20, 21], dtype=torch.int64)
"""
ASSIGN_EXPECTED = [
    [20, 21, -1, -1, -1, -1, -1, -1],
    [-1, -1, -1, -1, -1, -1, -1, -1],
    [-1, 10, 11, 12, -1, -1, -1, -1],
    [-1, -1, -1, -1, -1, -1, -1, -1],
]


@pytest.mark.slow
def test_assign_req_to_token_pool_writes_each_requests_slots_into_its_row(
    built_runtime,
):
    finished = run_in_runtime(
        built_runtime,
        ASSIGN_EXAMPLE
        + """
    from sgl_kernel import assign_req_to_token_pool_cpu
    for _ in range(2):
        assign_req_to_token_pool_cpu(
            req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, 8
        )
    print(req_to_token.tolist())
    """,
    )
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout) == ASSIGN_EXPECTED
    # Two calls, one line: only the first call in a process is reported.
    (line,) = [line for line in finished.stderr.splitlines() if "stand-in" in line]
    match = STAND_IN_LINE.match(line)
    assert match is not None and not match["placeholder"]
    assert match["op"] == "assign_req_to_token_pool_cpu"


@pytest.mark.slow
def test_sglangs_own_caller_gets_the_same_table(built_runtime, sglang_0_5_23):
    """SGLang 0.5.23's ``assign_req_to_token_pool_func`` on CPU, through the
    stand-in: the arguments it passes mean what the stand-in assumes."""
    tree, _ = sglang_0_5_23
    finished = run_in_runtime(
        built_runtime,
        ASSIGN_EXAMPLE
        + """
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool_func
    assign_req_to_token_pool_func(
        req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, 3
    )
    print(req_to_token.tolist())
    """,
        tree / "python",
        environment={"SGLANG_USE_CPU_ENGINE": "1"},
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert json.loads(finished.stdout.splitlines()[-1]) == ASSIGN_EXPECTED


@pytest.mark.slow
def test_sglangs_cpu_path_imports_with_the_stand_in_and_no_amx(
    built_runtime, sglang_0_5_23
):
    """Every name SGLang 0.5.23 takes from sgl_kernel at import time on CPU is
    there, none is called, and SGLang sees no AMX kernels."""
    tree, _ = sglang_0_5_23
    finished = run_in_runtime(
        built_runtime,
        """
        import json
        import sglang.srt.managers.scheduler
        import sglang.srt.managers.tokenizer_manager
        import sglang.srt.models.qwen3_5
        import sglang.srt.models.qwen3_vl
        from sglang.srt.utils.common import cpu_has_amx_support, is_cpu
        print(json.dumps([is_cpu(), cpu_has_amx_support()]))
        """,
        tree / "python",
        environment={"SGLANG_USE_CPU_ENGINE": "1"},
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert json.loads(finished.stdout.splitlines()[-1]) == [True, False]
    assert "serving-study stand-in" not in finished.stderr


@pytest.mark.slow
def test_the_probe_reads_torchs_threads_without_importing_it(built_runtime, tmp_path):
    module = fake_mm_utils(tmp_path)
    finished = run_in_runtime(
        built_runtime,
        """
        import torch
        torch.set_num_threads(1)
        import sglang.srt.managers.mm_utils
        """,
        tmp_path,
    )
    assert finished.returncode == 0, finished.stderr
    (line,) = probe_lines(finished.stderr)
    assert line["sha256"] == hashlib.sha256(module.read_bytes()).hexdigest()
    assert line["torch_threads"] == 1


@pytest.mark.slow
def test_the_main_process_steps_are_measured_in_the_servers_runtime(
    built_runtime, sglang_0_5_23, tmp_path
):
    """real_server_benchmarks' split: the processor and the release's own SHM copy,
    run by file path from inside this package's studies/ folder (with -P, so that
    none of its modules can shadow the standard library's)."""
    tree, _ = sglang_0_5_23
    model = tmp_path / "model"
    write_tiny_qwen3_vl(model, TinyModelSettings(seed=0))
    images = []
    for index in range(2):
        path = tmp_path / f"image{index}.jpg"
        Image.effect_noise((256, 256), 64 + index).convert("RGB").save(path)
        images.append(path)
    steps = measure_main_process_steps(
        runtime_python=built_runtime["python"],
        python_path=python_path(CPU_PLATFORM, str(tree / "python")),
        arm_environment={"OMP_NUM_THREADS": "1"},
        model_directory=model,
        images=images,
    )
    assert steps["images"] == 2
    assert steps["torch_threads"] == 1
    # A 256x256 image: 64 image tokens, each from 2x2 patches of 1536 values.
    assert steps["pixel_values_shape"] == [256, 1536]
    assert steps["processor_cpu_ms_per_image"] > 0
    assert steps["shm_copy_cpu_ms_per_image"] > 0
