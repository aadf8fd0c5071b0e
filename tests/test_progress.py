"""The progress line of a run, on a pseudo-terminal: a real short client run in a
child whose stdout is the terminal of its own session and whose stderr is a log
file, as a run_arm job's are when Snakemake runs in a terminal."""

import fcntl
import json
import os
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

from test_client import write_workload

from serving_study.measure.progress import ProgressLine

TESTS = Path(__file__).resolve().parent

# The child: takes the pty on its stdin as its session's terminal, runs the client
# with progress on against a real HTTP server, then asks from a process group of
# its own (sent to the background) and from its own group where the line would go.
CHILD = r"""
import asyncio, fcntl, json, subprocess, sys, termios
from pathlib import Path
from aiohttp import web
from test_client import FakeServer, MODEL
from serving_study.measure.chat_requests import load_requests
from serving_study.measure.client import run_load

fcntl.ioctl(0, termios.TIOCSCTTY, 0)
manifest, requests, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])

async def main():
    server = FakeServer(tokens=16)
    app = web.Application(client_max_size=2**26)
    app.router.add_post("/v1/chat/completions", server.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        await run_load(
            f"http://127.0.0.1:{runner.addresses[0][1]}",
            load_requests(Path(manifest)),
            concurrency=1,
            measured_requests=requests,
            warmup_requests=4,
            output_tokens=16,
            model=MODEL,
            out_path=out / "requests.jsonl",
            progress=True,
            request_timeout_s=60,
        )
    finally:
        await runner.cleanup()

asyncio.run(main())
ask = [sys.executable, "-c", "from serving_study.measure.progress import "
       "progress_terminal as t; raise SystemExit(t() is not None)"]
drawn = {
    "background": subprocess.run(ask, process_group=0).returncode == 1,
    "foreground": subprocess.run(ask).returncode == 1,
}
(out / "drawn.json").write_text(json.dumps(drawn))
"""


def drained(primary: int) -> bytes:
    """Everything written to a pseudo-terminal until its last writer closed it;
    closes it."""
    shown = bytearray()
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # EIO: no writer is left
            break
        if not chunk:
            break
        shown.extend(chunk)
    os.close(primary)
    return bytes(shown)


def run_on_a_terminal(tmp_path: Path, requests: int, **environment) -> dict:
    """The child's terminal output, log, request log and where it would draw."""
    manifest = write_workload(tmp_path)
    primary, secondary = os.openpty()
    # A terminal of 24 rows and 100 columns (a new pty has none).
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    log_path = tmp_path / "job.log"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    env.pop("CI", None)
    shown = bytearray()
    reader = threading.Thread(target=lambda: shown.extend(drained(primary)))
    reader.start()
    with open(log_path, "w") as log:
        child = subprocess.run(
            [sys.executable, "-c", CHILD, str(manifest), str(requests), str(tmp_path)],
            stdin=secondary,
            stdout=secondary,
            stderr=log,
            env=env | environment,
            start_new_session=True,
            timeout=60,
            check=False,
        )
    os.close(secondary)
    reader.join(timeout=10)
    log_text = log_path.read_text()
    assert child.returncode == 0, log_text
    return {
        "terminal": shown.decode(errors="replace"),
        "log": log_text,
        "requests": (tmp_path / "requests.jsonl").read_text().splitlines(),
        "drawn": json.loads((tmp_path / "drawn.json").read_text()),
    }


def test_a_run_draws_one_updating_line_on_the_terminal_and_none_in_its_log(
    tmp_path,
):
    """24 requests of ~40 ms: the line is redrawn every 0.5 s while they run."""
    seen = run_on_a_terminal(tmp_path, requests=20)
    assert len(seen["requests"]) == 24  # the run happened
    terminal = seen["terminal"]
    assert "warm-up 0/24 done" in terminal
    drawn = re.findall(
        r"measured (\d+)/24 done, +([\d.]+) req/s so far, "
        r"00:0\d elapsed, 0 errors, [01] in flight",
        terminal,
    )
    # Redrawn in place mid-run: done so far of total, with the rate so far.
    assert drawn and all(0 < int(done) < 24 for done, _ in drawn), terminal
    assert all(float(rate) > 0 for _, rate in drawn)
    assert "\r" in terminal and "\n" not in terminal.strip()
    # Cleared at the end, and nothing of it in the job's log.
    assert terminal.rstrip(" ").endswith("\r")
    assert "\r" not in seen["log"] and "done" not in seen["log"]
    # Sent to the background (a process group that is not the terminal's
    # foreground), a run would draw nothing.
    assert seen["drawn"] == {"background": False, "foreground": True}


def test_in_ci_a_run_draws_nothing_on_a_terminal(tmp_path):
    seen = run_on_a_terminal(tmp_path, requests=2, CI="true")
    assert len(seen["requests"]) == 6
    assert "done" not in seen["terminal"]
    assert seen["drawn"] == {"background": False, "foreground": False}


def test_a_terminal_that_reports_no_size_still_gets_the_line():
    """A new pseudo-terminal (or some containers') says 0 x 0: tqdm alone would
    draw nothing on it."""
    primary, secondary = os.openpty()
    with open(secondary, "w", encoding="utf-8") as terminal:
        line = ProgressLine(total=8, warmup=2, terminal=terminal)
        line.show(done=5, errors=1, in_flight=2)
        line.close()
    shown = drained(primary).decode()
    assert "measured 5/8 done" in shown and "1 errors" in shown
    # Never wider than 80 columns, the size taken for a terminal that says none.
    assert max(len(drawn) for drawn in shown.split("\r")) <= 80
