"""The fault matrix, one (arm, run): faults test_arm_runner.py does not cover.

A server that is healthy and serves chat but answers 500 on /server_info, and a
run directory whose disk fills up while the server serves. Each ends as a failed
run, or an error, that names the fault; no run that claims to be valid is
written, nothing of the run enters the aggregated tables, and no process,
cgroup or shared-memory segment of the run is left.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import test_arm_runner
from study_helpers import leaked_segments, serving_scheduler, study_groups

from serving_study.analysis.aggregate import tables_from_metrics

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the arms' CPU quota is a cgroup only root can create"
    ),
]

# The real variant and the tiny workload, and one run on them, as the arm tests
# make them.
variant = test_arm_runner.variant
workload = test_arm_runner.workload
ARM = test_arm_runner.ARM
arm_with = test_arm_runner.arm_with
run = test_arm_runner.run


def live_descendants() -> set[int]:
    """This test process's live children (zombies only wait to be reaped)."""
    found = set()
    for process in psutil.Process().children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                found.add(process.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def leftovers(descendants_before: set[int]) -> list[str]:
    """What the run left: processes it started, segments whose creator is gone,
    and cgroups of this runner (the test process) wherever the servers code
    makes them. Children from before the run (a resource tracker) are not its."""
    return [
        *(f"process {pid}" for pid in live_descendants() - descendants_before),
        *(str(path) for path in leaked_segments()),
        *(str(path) for path in study_groups("faults", lambda o: o == os.getpid())),
    ]


def assert_left_out_of_the_tables(metrics: dict) -> None:
    """The aggregate counts the run as invalid: no median of the arm uses it."""
    tables = tables_from_metrics([metrics], {"arms": [ARM.as_config()]})
    assert (tables["arms"]["n_valid"] == 0).all()
    assert tables["arms"]["median"].isna().all()
    assert list(tables["invalid_runs"]["arm"]) == [ARM.name]


SERVER_INFO_FAILS = """
import sys
from aiohttp import web

async def health(request):
    return web.Response(text="ok")

async def server_info(request):
    return web.json_response({"error": "injected"}, status=500)

async def chat(request):
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"choices":[{"delta":{"content":"a"}}]}\\n\\n')
    await response.write(b"data: [DONE]\\n\\n")
    return response

app = web.Application()
app.router.add_get("/health", health)
app.router.add_get("/server_info", server_info)
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[-1]), print=None)
"""


def test_a_500_on_server_info_fails_the_run_naming_it(variant, workload, tmp_path):
    script = tmp_path / "server_info_fails.py"
    script.write_text(SERVER_INFO_FAILS)
    before = live_descendants()
    metrics = run(
        variant,
        workload,
        tmp_path / "run",
        arm=arm_with(requests=8),
        argv=[sys.executable, str(script)],
    )
    assert metrics["valid"] is False
    assert metrics["invalid_reasons"] == [
        "the server answered GET /server_info with HTTP 500 "
        '(\'{"error": "injected"}\'); the runner needs it to check which '
        "server it measures"
    ]
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["valid"] is False
    assert_left_out_of_the_tables(saved)
    assert leftovers(before) == []


@pytest.fixture
def small_disk(tmp_path):
    """A directory on its own 8 MiB tmpfs, unmounted when the test ends."""
    directory = tmp_path / "small-disk"
    directory.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(directory)], check=True
    )
    yield directory
    subprocess.run(["umount", "--lazy", str(directory)], check=True)


def fill_once_serving(directory: Path) -> threading.Thread:
    """Fill ``directory``'s disk to the last byte a second after the run's server
    has started its scheduler: the start, and so the run's first files, fit."""

    def fill():
        deadline = time.monotonic() + 120
        while not serving_scheduler(os.getpid()):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        time.sleep(1.0)  # past the start, into warm-up or the window
        with open(directory / "ballast", "wb", buffering=0) as ballast:
            try:
                while ballast.write(bytes(1 << 16)):
                    continue
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise

    filler = threading.Thread(target=fill, daemon=True)
    filler.start()
    return filler


def test_a_disk_that_fills_during_the_run_stops_it_with_a_clear_error(
    variant, workload, small_disk
):
    """The request log, written as the window closes, finds no room: the runner
    stops with ENOSPC (the job fails, and a rerun measures the run afresh), its
    server torn down and no metrics.json written."""
    filler = fill_once_serving(small_disk)
    before = live_descendants()
    arm = arm_with(requests=100)  # serves for seconds: the disk fills meanwhile
    with pytest.raises(OSError, match="No space left on device") as raised:
        run(variant, workload, small_disk, arm=arm)
    filler.join()
    assert raised.value.errno == errno.ENOSPC
    assert shutil.disk_usage(small_disk).free < 1 << 16, "the disk never filled"
    assert not (small_disk / "metrics.json").exists()
    assert leftovers(before) == []
