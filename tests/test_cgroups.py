"""CPU-quota groups on this machine's real cgroup filesystem."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from study_helpers import needs_cgroups

from serving_study.servers import cgroup_exec
from serving_study.servers.cgroup_hierarchy import (
    Layout,
    QuotaUnavailable,
    directory_of,
    read_membership,
    read_mounts,
)
from serving_study.servers.cgroups import (
    AT_ROOT_VARIABLE,
    CpuQuotaGroup,
    _check_room_for_groups,
    _create_v2,
    wrap_command,
)
from serving_study.servers.cpu_group import CpuGroup, CpuStat, group_of_pid

BUSY_LOOP = [sys.executable, "-c", "while True: pass"]


def not_running(pid: int) -> bool:
    """Gone, or a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def unique_name() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@needs_cgroups
def test_quota_limits_a_busy_loop_and_counts_throttling():
    group = CpuQuotaGroup.create(unique_name(), 0.2)
    process = None
    try:
        quota = group.quota_in_force()
        assert quota["quota_us"] == 20_000 and quota["period_us"] == 100_000
        assert quota["cores"] == pytest.approx(0.2)
        process = subprocess.Popen(wrap_command(group, BUSY_LOOP))
        time.sleep(0.3)  # let the interpreter start inside the group
        before = group.read_stat()
        time.sleep(1.5)
        after = group.read_stat()
        change = before.delta(after)
        assert group.pids() == [process.pid]
        # A busy loop would use a whole core; the quota holds it to 0.2 at most
        # (less when other work on the machine takes the CPU first).
        assert 0.05 < change["cores_used"] < 0.3
        assert change["nr_periods"] >= 10
        assert change["nr_throttled"] > 0
        assert change["throttled_seconds"] > 0
    finally:
        group.remove()
        if process is not None:
            process.wait(timeout=5)
    assert process.returncode == -9
    assert not any(directory.exists() for directory in group.directories())
    group.remove()  # idempotent


@needs_cgroups
def test_group_without_quota_counts_usage_and_never_throttles():
    with CpuQuotaGroup.create(unique_name(), None) as group:
        assert group.quota_in_force()["quota_us"] is None
        assert group.quota_in_force()["cores"] is None
        process = subprocess.Popen(wrap_command(group, BUSY_LOOP))
        try:
            time.sleep(0.3)
            before = group.read_stat()
            time.sleep(1.0)
            change = before.delta(group.read_stat())
            assert change["usage_seconds"] > 0.2  # the loop ran, and was counted
            assert change["nr_throttled"] == 0
            assert change["throttled_seconds"] == 0
        finally:
            group.kill_all()
            process.wait(timeout=5)
    assert not any(directory.exists() for directory in group.directories())


@needs_cgroups
def test_children_inherit_the_group_and_remove_kills_them_all():
    group = CpuQuotaGroup.create(unique_name(), 0.5)
    spawner = (
        "import subprocess, sys, time\n"
        "children = [subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(60)']) for _ in range(2)]\n"
        "print(' '.join(str(c.pid) for c in children), flush=True)\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen(
        wrap_command(group, [sys.executable, "-c", spawner]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        children = [int(pid) for pid in process.stdout.readline().split()]
        assert sorted(group.pids()) == sorted([process.pid, *children])
        assert group_of_pid(children[0]).directories() == group.directories()
    finally:
        group.remove()
        process.wait(timeout=5)
        process.stdout.close()
    # Orphans are reaped by init whenever it gets to it: dead is enough.
    assert all(not_running(pid) for pid in children)
    assert not any(directory.exists() for directory in group.directories())


@needs_cgroups
def test_group_of_pid_reads_a_group_without_owning_it():
    with CpuQuotaGroup.create(unique_name(), 0.3) as group:
        process = subprocess.Popen(
            wrap_command(group, [sys.executable, "-c", "import time; time.sleep(30)"])
        )
        try:
            time.sleep(0.2)
            found = group_of_pid(process.pid)
            assert found.quota_in_force()["cores"] == pytest.approx(0.3)
            assert found.pids() == [process.pid]
            assert isinstance(found.read_stat(), CpuStat)
            assert not hasattr(found, "remove")
        finally:
            group.kill_all()
            process.wait(timeout=5)


@needs_cgroups
def test_a_name_still_holding_processes_is_refused():
    name = unique_name()
    with CpuQuotaGroup.create(name, None) as group:
        process = subprocess.Popen(wrap_command(group, BUSY_LOOP))
        try:
            time.sleep(0.2)
            with pytest.raises(QuotaUnavailable, match="already exists and holds"):
                CpuQuotaGroup.create(name, None)
        finally:
            group.kill_all()
            process.wait(timeout=5)


@needs_cgroups
def test_a_period_other_than_the_default_is_written_and_read_back():
    with CpuQuotaGroup.create(unique_name(), 1.5, period_us=50_000) as group:
        quota = group.quota_in_force()
    assert (quota["quota_us"], quota["period_us"]) == (75_000, 50_000)
    assert quota["cores"] == pytest.approx(1.5)


def test_bad_quota_arguments_are_refused_before_touching_the_system():
    with pytest.raises(ValueError, match="quota_cores must be positive"):
        CpuQuotaGroup.create("x", 0)
    with pytest.raises(ValueError, match="at least 1000 us"):
        CpuQuotaGroup.create("x", 0.005)
    with pytest.raises(ValueError, match="one non-empty path element"):
        CpuQuotaGroup.create("a/b", 1)


def test_a_read_only_cgroup_filesystem_is_reported_with_the_way_out():
    if os.geteuid() != 0:
        with pytest.raises(QuotaUnavailable, match="cpu_quota: none"):
            CpuQuotaGroup.create(unique_name(), 1)
        return
    # As root, remount the cgroup filesystems read-only in a private mount namespace.
    script = (
        "from serving_study.servers.cgroups import CpuQuotaGroup, QuotaUnavailable\n"
        "try:\n"
        "    CpuQuotaGroup.create('never', 1).remove()\n"
        "except QuotaUnavailable as error:\n"
        "    print(error)\n"
    )
    remounts = " && ".join(
        f"mount -o remount,bind,ro {mount}"
        for mount in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct")
        if os.path.ismount(mount)
    )
    if not remounts:
        pytest.skip("no cgroup v1 cpu mount to make read-only here")
    source_root = Path(__file__).resolve().parents[1] / "src"
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f'{remounts} && exec "$0" -c "$1"']
        + [sys.executable, script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(source_root)},
        timeout=30,
    )
    if "mount" in result.stderr or "unshare" in result.stderr:
        pytest.skip(f"cannot make a read-only mount namespace: {result.stderr}")
    assert "Read-only file system" in result.stdout, result.stderr
    assert "cpu_quota: none" in result.stdout


# --- Parsing, on the text of real layouts ---------------------------------------------

SPLIT_V1_MOUNTINFO = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
DOCKER_V1_MOUNTINFO = (
    "700 690 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup "
    "cgroup rw,cpu,cpuacct\n"
)


def test_mounts_and_membership_are_parsed_for_split_and_joined_v1():
    mounts = read_mounts(SPLIT_V1_MOUNTINFO)
    v1 = {
        mount.mount_point.name: mount.controllers
        for mount in mounts
        if mount.version == 1
    }
    assert v1 == {"cpu": {"cpu"}, "cpuacct": {"cpuacct"}}
    assert [m.version for m in mounts if m.mount_point.name == "unified"] == [2]

    membership = read_membership("2:cpuacct:/a/b\n1:cpu:/a/b\n0::/\n")
    assert membership == {"cpuacct": "/a/b", "cpu": "/a/b", "": "/"}

    (docker,) = read_mounts(DOCKER_V1_MOUNTINFO)
    assert docker.controllers == {"cpu", "cpuacct"}
    # Inside a container the mount shows the container's own group as its root.
    assert directory_of(docker, "/docker/abc") == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert directory_of(docker, "/docker/abc/x") == Path("/sys/fs/cgroup/cpu,cpuacct/x")


def test_v2_stat_and_quota_are_read_from_their_files(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "cpu.stat").write_text(
        "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n"
        "nr_periods 40\nnr_throttled 10\nthrottled_usec 300000\n"
    )
    (tmp_path / "cgroup.procs").write_text("12\n7\n")
    group = CpuGroup(Layout(2, tmp_path, tmp_path))
    assert group.quota_in_force()["cores"] == 1.5
    stat = group.read_stat()
    assert (stat.usage_seconds, stat.nr_periods, stat.nr_throttled) == (2.5, 40, 10)
    assert stat.throttled_seconds == pytest.approx(0.3)
    assert group.pids() == [7, 12]
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert group.quota_in_force()["quota_us"] is None


def test_v2_creation_enables_cpu_and_writes_cpu_max_in_a_stand_in_tree(tmp_path):
    # No cgroup v2 cpu controller on the development machine: plain files stand in
    # for the kernel's, so this checks which files the v2 path writes, not the kernel.
    own = tmp_path / "own"
    own.mkdir()
    (own / "cgroup.procs").write_text("1\n")
    (own / "cgroup.controllers").write_text("cpu memory\n")  # delegated to us
    (own / "cgroup.subtree_control").write_text("memory\n")
    original_mkdir = Path.mkdir

    def mkdir_with_control_files(path, *arguments, **keywords):
        original_mkdir(path, *arguments, **keywords)
        if not (path / "cgroup.subtree_control").exists():
            (path / "cgroup.subtree_control").write_text("")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "mkdir", mkdir_with_control_files)
        layout = _create_v2(own, "arm-a")
    assert layout.cpu_directory == own / "serving-study" / "arm-a"
    # Our processes left our cgroup for a leaf, so that it may hand on `cpu`.
    assert (own / "serving-study-runner" / "cgroup.procs").read_text() == "1"
    assert (own / "cgroup.subtree_control").read_text() == "+cpu"
    assert (own / "serving-study" / "cgroup.subtree_control").read_text() == "+cpu"
    group = CpuQuotaGroup(layout)
    group._write_quota(150_000, 100_000)
    assert (layout.cpu_directory / "cpu.max").read_text() == "150000 100000"
    group._write_quota(None, 100_000)
    assert (layout.cpu_directory / "cpu.max").read_text() == "max 100000"
    assert group.procs_files() == [layout.cpu_directory / "cgroup.procs"]


def test_stat_delta_divides_by_wall_time_and_handles_no_periods():
    before = CpuStat(1.0, 10, 2, 0.1, read_at=100.0)
    after = CpuStat(3.0, 30, 12, 0.6, read_at=102.0)
    change = before.delta(after)
    assert change["cores_used"] == pytest.approx(1.0)
    assert change["throttled_share"] == pytest.approx(0.5)
    assert change["throttled_seconds"] == pytest.approx(0.5)
    idle = CpuStat(1.0, 10, 2, 0.1, read_at=103.0)
    assert before.delta(idle)["throttled_share"] is None


def test_cgroup_exec_refuses_a_command_line_without_separator(capsys):
    assert cgroup_exec.main(["--join", "/nonexistent"]) == 2
    assert "missing `--`" in capsys.readouterr().err


def test_cgroup_exec_reports_a_group_it_cannot_join(tmp_path):
    missing = tmp_path / "no-such-group" / "cgroup.procs"
    result = subprocess.run(
        [sys.executable, cgroup_exec.__file__, "--join", str(missing), "--", "true"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 125
    assert "cannot join cgroup" in result.stderr


def test_cgroup_exec_becomes_the_command(tmp_path):
    procs_file = tmp_path / "cgroup.procs"  # a plain file stands in for the group
    script = "import os; print(os.getpid())"
    result = subprocess.run(
        [
            sys.executable,
            cgroup_exec.__file__,
            "--join",
            str(procs_file),
            "--",
            sys.executable,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    # Same pid: the command replaced the helper after the helper joined.
    assert procs_file.read_text() == result.stdout.strip()


def test_v2_groups_go_to_the_root_only_when_asked(tmp_path, monkeypatch):
    """Without `cpu` delegated to our cgroup, the hierarchy's root would put the
    server outside any limit around us (a SLURM job, a systemd slice)."""
    own = tmp_path / "own"
    own.mkdir()
    for directory in (tmp_path, own):
        (directory / "cgroup.procs").write_text("")
        (directory / "cgroup.controllers").write_text("memory\n")
        (directory / "cgroup.subtree_control").write_text("")
    monkeypatch.delenv(AT_ROOT_VARIABLE, raising=False)
    with pytest.raises(QuotaUnavailable, match="Delegate=yes.*CGROUPS_AT_ROOT=1"):
        _check_room_for_groups(Layout(2, own, own))
    monkeypatch.setenv(AT_ROOT_VARIABLE, "1")
    _check_room_for_groups(Layout(2, own, own))


def test_a_v2_group_is_killed_at_once_through_cgroup_kill(tmp_path):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        (tmp_path / "cgroup.kill").write_text("")
        group = CpuQuotaGroup(Layout(2, tmp_path, tmp_path))
        with pytest.raises(TimeoutError):  # a plain file kills nobody: signals follow
            group.kill_all(timeout=0.05)
        assert (tmp_path / "cgroup.kill").read_text() == "1"
    finally:
        sleeper.kill()
        sleeper.wait()
