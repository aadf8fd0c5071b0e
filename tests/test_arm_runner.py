"""One (arm, run) when things go wrong: the run is recorded as failed, nothing leaks.

Each test runs the real arm runner with the real embedded engine on a tiny workload
and breaks something: a server that never becomes healthy, a scheduler or a main
process killed in the middle of the measured requests. Afterwards the run's outputs
all exist (so the study goes on and the report can list the failure), the run is
not valid, and no process, cgroup or shared-memory segment of the run is left.
"""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from study_helpers import embedded_arm, embedded_run_settings, leaked_segments

from serving_study.config.records import Arm, HostSharing, Variant
from serving_study.launch.engines import launch_plan
from serving_study.measure.arm_runner import run_arm
from serving_study.measure.run_outputs import RunPaths
from serving_study.servers.cgroups import project_group_directories
from serving_study.sources.variants import prepare_variant
from serving_study.workloads import generate_workload

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the arms' CPU quota is a cgroup only root can create"
)

SETTINGS = embedded_run_settings(
    decode_step_ms=20, warmup_requests=2, health_timeout_s=60
)
ARM = embedded_arm("faulty", requests=40, output_tokens=16)


def arm_with(**changes) -> Arm:
    return dataclasses.replace(ARM, **changes)


@pytest.fixture(scope="module")
def variant(sglang_0_5_23, tmp_path_factory) -> dict:
    tree, identity = sglang_0_5_23
    dest = tmp_path_factory.mktemp("variant") / "original"
    record = {"name": "original", "source": "sglang-0.5.23"}
    return prepare_variant(record, tree, identity, None, dest)


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("workload") / "tiny"
    spec = {"name": "tiny", "seed": 1, "images": 4, "width": 256, "height": 256}
    spec["input_tokens"] = 16
    generate_workload(spec | {"format": "png", "content": "noise"}, out)
    return out / "manifest.json"


def run_paths(directory: Path) -> RunPaths:
    directory.mkdir(parents=True, exist_ok=True)
    return RunPaths.in_directory(directory)


# These runs prove teardown, failures and secrets, not the host-load check
# (test_host_load.py proves that): on a busy CI host, other work would make a
# healthy run invalid, so their runs are not judged by the host's other load.
SHARING = HostSharing.from_config(
    {"max_other_load_cores": 4096, "max_steal_cores": 4096}
)


def run(
    variant: dict,
    workload: Path,
    directory: Path,
    arm: Arm = ARM,
    sharing: HostSharing = SHARING,
    argv: list[str] | None = None,
) -> dict:
    """One run of the arm's launch plan; ``argv``, when given, starts a stand-in
    server in place of the engine's (it gets ``--port <port>`` last)."""
    settings = dict(SETTINGS)
    variant = Variant.from_identity(variant)
    plan = launch_plan(settings.pop("server_settings"), arm, variant, workload)
    if argv is not None:
        plan = dataclasses.replace(plan, argv=tuple(argv))
    return run_arm(
        experiment="faults",
        arm=arm,
        run=1,
        variant=variant,
        workload_manifest=workload,
        plan=plan,
        **settings,
        paths=run_paths(directory),
        sharing=sharing,
    )


def own_descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def kill_once_measuring(pick, signal_number=signal.SIGKILL) -> threading.Thread:
    """Kill the process ``pick`` chooses once the scheduler has served a while."""

    def watch():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            schedulers = [
                process
                for process in own_descendants()
                if process.cmdline()[:1] == ["sglang::scheduler"]
            ]
            if schedulers:
                time.sleep(3.0)  # past start-up and warm-up, into the measured run
                os.kill(pick(schedulers[0]).pid, signal_number)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


@pytest.fixture(autouse=True)
def descendants_before_the_test():
    """Children this test did not start (e.g. a multiprocessing resource tracker
    an earlier test of the session left) are no leak of the run under test."""
    ALREADY_RUNNING.clear()
    ALREADY_RUNNING.update(process.pid for process in own_descendants())


ALREADY_RUNNING: set[int] = set()


def new_descendants() -> list[psutil.Process]:
    """Live children this test started (zombies only wait to be reaped)."""
    return [
        process
        for process in own_descendants()
        if process.pid not in ALREADY_RUNNING
        and process.status() != psutil.STATUS_ZOMBIE
    ]


def assert_nothing_left(directory: Path) -> None:
    for name in ("metrics.json", "requests.jsonl", "monitors.json", "provenance.json"):
        assert (directory / name).exists(), name
    left = new_descendants()
    assert not left, [process.cmdline() for process in left]
    assert not leaked_segments()
    assert not [d for d in project_group_directories() if d.name.startswith("faults-")]


def test_a_healthy_run_is_valid_and_leaves_nothing(variant, workload, tmp_path):
    metrics = run(variant, workload, tmp_path)
    assert metrics["valid"], metrics["invalid_reasons"]
    assert metrics["requests_completed"] == 40
    assert_nothing_left(tmp_path)


def test_a_run_beside_other_work_is_invalid_for_the_hosts_load(
    variant, workload, tmp_path
):
    # Two processes that spin on this 2-CPU host's cores for the whole run: under
    # the default bound of 0.5 other cores, the run cannot count as measured alone.
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)
    ]
    try:
        metrics = run(variant, workload, tmp_path, sharing=HostSharing.from_config({}))
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert not metrics["valid"]
    (reason,) = [r for r in metrics["invalid_reasons"] if "other work" in r]
    assert "above the allowed 0.5 (host_sharing.max_other_load_cores)" in reason
    assert_nothing_left(tmp_path)


def test_a_server_that_never_gets_healthy_is_a_failed_run(variant, tmp_path, workload):
    broken = dict(variant, sglang_python_root=str(tmp_path / "no-such-source"))
    metrics = run(broken, workload, tmp_path / "run")
    assert metrics["valid"] is False
    assert "server never healthy" in " ".join(metrics["invalid_reasons"])
    provenance = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert "no-such-source" in provenance["failure"]  # the server log's tail
    assert_nothing_left(tmp_path / "run")


def test_scheduler_killed_mid_run_fails_the_run(variant, workload, tmp_path):
    watcher = kill_once_measuring(lambda scheduler: scheduler)
    metrics = run(variant, workload, tmp_path)
    watcher.join()
    assert metrics["valid"] is False
    assert metrics["throughput_rps"] is None or metrics["invalid_reasons"]
    assert_nothing_left(tmp_path)


def test_main_process_killed_mid_run_fails_the_run(variant, workload, tmp_path):
    watcher = kill_once_measuring(lambda scheduler: scheduler.parent())
    metrics = run(variant, workload, tmp_path)
    watcher.join()
    assert metrics["valid"] is False
    assert_nothing_left(tmp_path)


def test_sigterm_mid_run_cleans_up_and_writes_no_metrics(variant, workload, tmp_path):
    """Snakemake stops jobs with SIGTERM: teardown must still run, and the run
    must not look finished (no metrics.json), so a rerun measures it afresh."""
    watcher = kill_once_measuring(
        lambda scheduler: psutil.Process(), signal_number=signal.SIGTERM
    )
    with pytest.raises(KeyboardInterrupt):
        run(variant, workload, tmp_path)
    watcher.join()
    assert not (tmp_path / "metrics.json").exists()
    assert not new_descendants()
    assert not leaked_segments()


def test_secrets_in_the_arm_environment_reach_the_server_but_no_file(
    variant, workload, tmp_path
):
    secret = "hf_not_a_real_token_0123456789"
    arm = arm_with(requests=8, environment={"HF_TOKEN": secret})
    metrics = run(variant, workload, tmp_path, arm=arm)
    assert metrics["valid"], metrics["invalid_reasons"]
    for path in tmp_path.iterdir():
        assert secret not in path.read_text(errors="replace"), path.name


ERRORING_SERVER = """
import sys
from aiohttp import web

async def health(request):
    return web.Response(text="ok")

async def chat(request):
    await request.read()
    if request.app["count"] % 2:
        request.app["count"] += 1
        return web.json_response({"error": "injected"}, status=500)
    request.app["count"] += 1
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"choices":[{"delta":{"content":"a"}}]}\\n\\n')
    return response  # cut before [DONE]

app = web.Application()
app["count"] = 0
app.router.add_get("/health", health)
app.router.add_get("/server_info", lambda request: web.json_response({}))
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[-1]), print=None)
"""


def test_a_server_answering_500s_and_cut_streams_gives_an_invalid_run(
    variant, workload, tmp_path
):
    script = tmp_path / "erroring_server.py"
    script.write_text(ERRORING_SERVER)
    metrics = run(
        variant,
        workload,
        tmp_path / "run",
        arm=arm_with(requests=10),
        argv=[sys.executable, str(script)],
    )
    assert metrics["valid"] is False
    assert metrics["error_count"] == 10
    assert any("did not complete" in reason for reason in metrics["invalid_reasons"])
    assert_nothing_left(tmp_path / "run")


def test_a_port_taken_before_the_server_binds_it_is_retried(
    variant, workload, tmp_path, monkeypatch
):
    import socket

    from serving_study.measure import server_start
    from serving_study.servers import local_runtime

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    ports = iter([taken])
    monkeypatch.setattr(
        server_start,
        "free_port",
        lambda: next(ports, None) or local_runtime.free_port(),
    )
    try:
        metrics = run(variant, workload, tmp_path, arm=arm_with(requests=8))
    finally:
        squatter.close()
    assert metrics["valid"], metrics["invalid_reasons"]
    assert "address already in use" in (tmp_path / "server.log").read_text().lower()


RUN_IN_SMALL_SHM = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from test_arm_runner import arm_with, run
variant = json.loads(Path(sys.argv[1]).read_text())
metrics = run(variant, Path(sys.argv[3]), Path(sys.argv[4]), arm=arm_with(requests=12))
print(json.dumps(metrics))
"""


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs util-linux unshare")
def test_a_too_small_dev_shm_makes_the_run_invalid(variant, workload, tmp_path):
    """A full /dev/shm silently switches SGLang (and the engine) to inline
    transport, skipping the copy under study: such a run must not count."""
    variant_file = tmp_path / "variant.json"
    variant_file.write_text(json.dumps(variant))
    script = tmp_path / "run_in_small_shm.py"
    script.write_text(RUN_IN_SMALL_SHM)
    mount_small_shm = 'mount -t tmpfs -o size=2m tmpfs /dev/shm && exec "$@"'
    finished = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount_small_shm]
        + ["sh", sys.executable, str(script), str(variant_file)]
        + [str(Path(__file__).parent), str(workload), str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    metrics = json.loads(finished.stdout.strip().splitlines()[-1])
    assert metrics["valid"] is False
    assert any("/dev/shm was full" in reason for reason in metrics["invalid_reasons"])


def test_an_unexpected_error_fails_only_that_run_and_tears_down(
    variant, workload, tmp_path, monkeypatch
):
    """A bug or a surprise after the window (here in the server checks) is
    recorded as this run's failure with its reason: the study goes on."""

    def surprise(*arguments):
        raise KeyError("transport")

    monkeypatch.setattr("serving_study.measure.arm_runner.server_identity", surprise)
    metrics = run(variant, workload, tmp_path, arm=arm_with(requests=8))
    assert metrics["valid"] is False
    assert metrics["invalid_reasons"] == ["unexpected KeyError: 'transport'"]
    provenance = json.loads((tmp_path / "provenance.json").read_text())
    assert "in surprise" in provenance["traceback"]
    assert_nothing_left(tmp_path)
