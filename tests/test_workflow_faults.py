"""Whole-workflow faults: an unwritable results directory, two pipelines at once."""

import json
import os
import shutil
import subprocess

import pytest
from study_helpers import snakemake_command

EXPERIMENT = "test-embedded"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the arms' CPU quota is a cgroup only root can create"
)


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs util-linux unshare")
def test_an_unwritable_results_directory_fails_clearly_and_starts_nothing(tmp_path):
    workdir = tmp_path / "study"
    (workdir / "results").mkdir(parents=True)
    read_only_results = (
        'mount --bind "$1/results" "$1/results" && '
        'mount -o remount,bind,ro "$1/results" && shift && exec "$@"'
    )
    finished = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
        + [read_only_results, "sh", str(workdir)]
        + snakemake_command(workdir, "--cores", "1", "all"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert finished.returncode != 0
    assert "Read-only file system" in finished.stdout + finished.stderr
    assert not list((workdir / "results").rglob("metrics.json"))


@pytest.mark.slow
def test_two_pipelines_at_once_measure_only_their_own_servers(tmp_path):
    workdirs = [tmp_path / "first", tmp_path / "second"]
    pipelines = [
        subprocess.Popen(
            snakemake_command(workdir, "--cores", "1", "all"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for workdir in workdirs
    ]
    for pipeline in pipelines:
        _, errors = pipeline.communicate(timeout=1200)
        assert pipeline.returncode == 0, errors[-3000:]
    servers_seen = set()
    windows = []
    for workdir in workdirs:
        for run in (workdir / "results" / EXPERIMENT).glob("*/run[0-9]*/"):
            provenance = json.loads((run / "provenance.json").read_text())
            monitors = json.loads((run / "monitors.json").read_text())
            window = monitors["window"]
            windows.append((window["start_epoch"], window["end_epoch"]))
            server = provenance["server_info"]
            assert monitors["processes"]["main_pid"] == server["pid"]
            assert monitors["processes"]["scheduler_pid"] == server["scheduler_pid"]
            assert set(monitors["processes"]["group_pids_at_start"]) >= {
                server["pid"],
                server["scheduler_pid"],
            }
            group = provenance["quota_in_force"]["directories"][0]
            assert group not in servers_seen
            servers_seen.add(group)
    assert len(servers_seen) == 4
    # The host's measurement lock: one pipeline's window never overlaps the other's.
    windows.sort()
    for (_, earlier_end), (later_start, _) in zip(windows, windows[1:], strict=False):
        assert later_start >= earlier_end
