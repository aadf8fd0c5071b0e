"""The host's other CPU load during a window, and the runs it makes invalid.

Synthetic /proc/stat readings and counters, so nothing depends on what else
this host is doing while the tests run.
"""

import os

import pytest
from study_helpers import arm_record

from serving_study.config.records import HostSharing
from serving_study.measure.host_load import (
    HostCpu,
    HostLoadMeter,
    parse_proc_stat,
    wait_for_quiet_host,
)
from serving_study.measure.run_validity import invalid_reasons
from serving_study.servers.cpu_group import CpuStat

TICKS = os.sysconf("SC_CLK_TCK")

# /proc/stat of a 2-CPU host: user nice system idle iowait irq softirq steal guest
# guest_nice. Guest time is already inside user and nice.
PROC_STAT = f"""\
cpu  {10 * TICKS} {2 * TICKS} {3 * TICKS} {500 * TICKS} {7 * TICKS} {1 * TICKS} \
{1 * TICKS} {4 * TICKS} {5 * TICKS} 0
cpu0 {5 * TICKS} {1 * TICKS} {2 * TICKS} {250 * TICKS} 0 0 0 {2 * TICKS} 0 0
cpu1 {5 * TICKS} {1 * TICKS} {1 * TICKS} {250 * TICKS} 0 0 0 {2 * TICKS} 0 0
intr 12345 0 0
ctxt 67890
btime 1764547200
"""


def test_busy_time_counts_user_nice_system_and_interrupts_not_idle_or_steal():
    host = parse_proc_stat(PROC_STAT)
    assert host.busy_seconds == pytest.approx(10 + 2 + 3 + 1 + 1)
    assert host.steal_seconds == pytest.approx(4)


def test_a_kernel_without_steal_fields_still_parses():
    host = parse_proc_stat(f"cpu  {TICKS} 0 {TICKS} {9 * TICKS} 0 0 0\n")
    assert host.busy_seconds == pytest.approx(2)
    assert host.steal_seconds == 0


def test_text_without_the_aggregate_line_is_refused():
    with pytest.raises(ValueError, match="no aggregate `cpu` line"):
        parse_proc_stat("cpu0 1 2 3 4\n")


class Counter:
    """A readable group (or the host, or the runner) whose counter the test sets."""

    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds

    def read_stat(self) -> CpuStat:
        return CpuStat(self.seconds, 0, 0, 0.0, 0.0)


def window(server: float, model: float, runner: float, host_busy: float) -> dict:
    """A 10 s window in which each counter advanced by the given seconds."""
    server_group, model_group, runner_cpu, host = (
        Counter(100.0),
        Counter(50.0),
        Counter(7.0),
        Counter(1000.0),
    )
    clock = Counter(0.0)
    meter = HostLoadMeter(
        [server_group, model_group],
        read_host=lambda: HostCpu(busy_seconds=host.seconds, steal_seconds=0.0),
        read_runner=lambda: runner_cpu.seconds,
        clock=lambda: clock.seconds,
    )
    meter.start()
    for counter, advance in (
        (server_group, server),
        (model_group, model),
        (runner_cpu, runner),
        (host, host_busy),
        (clock, 10.0),
    ):
        counter.seconds += advance
    return meter.stop()


def test_every_server_group_and_the_runner_count_as_the_runs_own():
    # 15 busy seconds over 10 s: 8 the server, 3 its model processes, 2 the client.
    load = window(server=8, model=3, runner=2, host_busy=15)
    assert load["host_busy_cores"] == pytest.approx(1.5)
    assert load["own_cores"] == pytest.approx(1.3)
    assert load["other_cores"] == pytest.approx(0.2)


ARM = arm_record()
# The one measured request the arm asks for, completed: only the load is in question.
LOG = [{"index": 0, "phase": "measured", "status": 200, "error": None, "end_s": 1.0}]


def reasons(load: dict, allowed: float | None) -> list[str]:
    checks = {"max_other_load_cores_allowed": allowed}
    return invalid_reasons(LOG, {"host_load": load}, ARM, checks)


def test_a_window_shared_with_other_work_is_invalid_and_says_how_busy():
    busy = window(server=8, model=0, runner=1, host_busy=15)  # 0.6 cores of others
    [reason] = reasons(busy, allowed=0.5)
    assert "other work on the host used 0.60 cores" in reason
    assert "above the allowed 0.5 (host_sharing.max_other_load_cores)" in reason


def test_a_quiet_window_or_an_unchecked_one_stays_valid():
    quiet = window(server=8, model=0, runner=1, host_busy=11)  # 0.2 cores of others
    assert reasons(quiet, allowed=0.5) == []
    busy = window(server=8, model=0, runner=1, host_busy=15)
    assert reasons(busy, allowed=None) == []


def test_a_window_with_steal_above_its_bound_is_invalid_and_says_so():
    load = window(server=8, model=0, runner=1, host_busy=11) | {"steal_cores": 0.4}
    checks = {"max_other_load_cores_allowed": 0.5, "max_steal_cores_allowed": 0.25}
    [reason] = invalid_reasons(LOG, {"host_load": load}, ARM, checks)
    assert "other guests 0.40 cores" in reason
    assert "above the allowed 0.25 (host_sharing.max_steal_cores)" in reason


def quiet_after(busy_windows: int, wait_s: float) -> tuple[dict, list[float]]:
    """Wait for a quiet host that is 1.5 cores busy for ``busy_windows`` windows
    of 10 s, then idle; return what the wait said and the sleeps it took."""
    host, clock, sleeps = Counter(1000.0), Counter(0.0), []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        host.seconds += 1.5 * seconds if len(sleeps) <= busy_windows else 0.0
        clock.seconds += seconds

    sharing = HostSharing.from_config({"quiet_for_s": 10, "quiet_wait_s": wait_s})
    quiet = wait_for_quiet_host(
        sharing,
        read_host=lambda: HostCpu(busy_seconds=host.seconds, steal_seconds=0.0),
        clock=lambda: clock.seconds,
        sleep=sleep,
    )
    return quiet, sleeps


def test_a_retry_waits_for_a_window_of_quiet():
    quiet, sleeps = quiet_after(busy_windows=2, wait_s=600)
    assert quiet["quiet"] and quiet["waited_s"] == pytest.approx(30)
    assert sleeps == [10, 10, 10]


def test_a_host_busy_past_the_wait_is_given_up_on():
    quiet, sleeps = quiet_after(busy_windows=100, wait_s=25)
    assert not quiet["quiet"] and len(sleeps) == 3
    assert quiet["last_window"]["other_cores"] == pytest.approx(1.5, abs=0.05)
