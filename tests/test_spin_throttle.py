"""The spin-throttle measurement: its readings and arithmetic, the real thing run
briefly, the libgomp defaults the docs quote, and every figure they quote."""

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from serving_study.measure.thread_cpu import (
    parse_voluntary_switches,
    read_thread_sleeps,
)
from serving_study.studies.spin_throttle import (
    SpinThrottleSettings,
    measure_spin_throttle,
    worker_figures,
)

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "docs" / "results" / "spin-throttle"


def test_a_thread_that_sleeps_is_counted_each_time():
    sleeps, started, slept, release = (
        5,
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    thread_ids = []

    def sleeper():
        thread_ids.append(threading.get_native_id())
        started.wait()
        for _ in range(sleeps):
            time.sleep(0.001)
        slept.set()
        release.wait()  # alive until the second reading

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        while not thread_ids:
            time.sleep(0.001)
        before = read_thread_sleeps(os.getpid())
        started.set()
        slept.wait()
        after = read_thread_sleeps(os.getpid())
    finally:
        release.set()
        thread.join()
    assert after[thread_ids[0]] - before[thread_ids[0]] >= sleeps


def test_the_status_line_is_found_and_its_absence_said():
    status = Path("/proc/self/status").read_bytes()
    assert parse_voluntary_switches(status) >= 0
    text = b"Name:\tx\nvoluntary_ctxt_switches:\t42\nnonvoluntary_ctxt_switches:\t7\n"
    assert parse_voluntary_switches(text) == 42
    with pytest.raises(ValueError, match="voluntary_ctxt_switches"):
        parse_voluntary_switches(b"Name:\tx\nnonvoluntary_ctxt_switches:\t7\n")


def test_worker_figures_are_per_worker_and_cycle_without_the_main_thread():
    main, worker, idle, new = 100, 101, 102, 103
    start = {main: (5_000_000, 1), worker: (1_000_000, 10), idle: (300, 2)}
    end = {
        main: (9_000_000, 9),  # left out: the op's caller
        worker: (5_000_000, 14),  # 4 ms, 4 sleeps
        idle: (300, 2),  # did not run: torch's other pool, say
        new: (2_000_000, 4),  # started in between: counts from zero
    }
    figures = worker_figures(start, end, main, pool_threads=3, cycles=2)
    # 6 ms and 8 sleeps over 2 workers and 2 cycles.
    assert figures == {
        "workers_that_ran": 2,
        "worker_cpu_ms_per_gap": 1.5,
        "worker_sleeps_per_gap": 2.0,
    }


def test_settings_left_out_take_the_schemas_defaults():
    settings = SpinThrottleSettings.from_config({"pool_threads": [4, 8]})
    assert settings.pool_threads == (4, 8)
    assert settings.visible_cpus == 2 and settings.cycles > 0 and settings.gap_ms > 0
    assert SpinThrottleSettings.from_config(settings.as_config()) == settings


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_pool_larger_than_the_cpus_is_throttled():
    """On two CPUs, 2 threads (fitting) against 4 (throttled). The checks are
    counts and gaps of orders of magnitude, which load on the host cannot close:
    a worker that spins without end never sleeps, and a throttled one sleeps in
    every gap however long it was told to spin."""
    figures = measure_spin_throttle(SpinThrottleSettings(2, (2, 4), 5, 50.0))
    case = {(c["pool_threads"], c["spin_count"]): c for c in figures["cases"]}
    assert len(case) == 6
    for (pool, _), figures_of_case in case.items():
        assert figures_of_case["workers_that_ran"] == pool - 1  # the whole team
        assert figures_of_case["torch_threads"] == pool
        assert figures_of_case["more_threads_than_cpus"] == (pool > 2)
    assert figures["host"]["libgomp"]["cpus"] == 2  # libgomp counts the mask

    def cpu(pool, spin):
        return case[(pool, spin)]["worker_cpu_ms_per_gap"]

    assert case[(2, "infinite")]["worker_sleeps_per_gap"] == 0
    assert case[(4, "infinite")]["worker_sleeps_per_gap"] >= 0.5
    assert cpu(2, "infinite") > 10 * cpu(4, "infinite")
    assert cpu(2, "default") > 10 * cpu(2, "0")


def torch_libgomp() -> Path | None:
    torch = pytest.importorskip("torch")
    found = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    return found[0] if found else None


def test_torchs_libgomp_sets_the_spin_counts_the_docs_quote():
    """libgomp's env.c sets the spin count (300,000 with OMP_WAIT_POLICY unset)
    and the throttled one (100 unset, 1,000 active) as immediates into two
    variables: the copy torch ships stores exactly those."""
    library = torch_libgomp()
    if library is None or shutil.which("objdump") is None:
        pytest.skip("no bundled libgomp or no objdump")
    listing = subprocess.run(
        ["objdump", "-d", str(library)], capture_output=True, text=True, check=True
    ).stdout
    if "x86-64" not in listing[:1000]:
        pytest.skip("the pattern below is x86-64's")
    stores = re.findall(
        r"movq\s+\$0x([0-9a-f]+),0x[0-9a-f]+\(%rip\)\s+# ([0-9a-f]+)", listing
    )
    targets = {}
    for value, address in stores:
        targets.setdefault(int(value, 16), set()).add(address)
    (spin,) = targets[300_000]
    assert spin not in targets[100]
    assert targets[100] & targets[1_000]  # the throttled count, either policy
