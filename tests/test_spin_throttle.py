"""The spin-throttle measurement: its readings and arithmetic, the real thing run
briefly, the libgomp defaults the docs quote, and every figure they quote."""

import json
import os
import re
import shutil
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from serving_study.measure.thread_cpu import (
    parse_voluntary_switches,
    read_thread_sleeps,
)
from serving_study.studies.spin_throttle import (
    ELEMENTS_PER_THREAD,
    WARMUP_CYCLES,
    SpinThrottleSettings,
    measure_spin_throttle,
    worker_figures,
)

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "docs" / "results" / "spin-throttle"
GPU_HOSTS = ROOT / "docs" / "gpu-hosts.md"
# libgomp's defaults with OMP_WAIT_POLICY unset (the spin count and the throttled
# one) and the throttled count under ACTIVE, as env.c sets them and the docs quote.
SPIN_COUNT, THROTTLED_SPIN_COUNT, THROTTLED_ACTIVE_SPIN_COUNT = 300_000, 100, 1_000


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
    (spin,) = targets[SPIN_COUNT]
    assert spin not in targets[THROTTLED_SPIN_COUNT]
    # The throttled count, under either policy.
    assert targets[THROTTLED_SPIN_COUNT] & targets[THROTTLED_ACTIVE_SPIN_COUNT]


def published(name: str = "spin_throttle.json") -> dict:
    return json.loads((PUBLISHED / name).read_text())


GPU_HOST_SECTION = "\n## On the GPU host (16 CPUs)\n"


def table_rows(figures: dict) -> list[str]:
    """The page's rows for a measurement: per pool, each spin setting's CPU per
    worker and gap, with its sleeps per gap in brackets."""
    cases, rows = by_case(figures), []
    for pool in figures["settings"]["pool_threads"]:
        larger = "yes" if cases[(pool, "default")]["more_threads_than_cpus"] else "no"
        cells = [
            f"{ms(cases[(pool, spin)]['worker_cpu_ms_per_gap'])} "
            f"({cases[(pool, spin)]['worker_sleeps_per_gap']:.2f})"
            for spin in ("default", "0", "infinite")
        ]
        rows.append(f"| {pool} | {larger} | {' | '.join(cells)} |")
    return rows


def by_case(figures: dict) -> dict:
    return {
        (case["pool_threads"], case["spin_count"]): case for case in figures["cases"]
    }


def ms(value: float) -> str:
    return f"{value:.3f} ms"


def flat(text: str) -> str:
    return " ".join(text.split())


def fitting_pool(figures: dict) -> dict:
    """The cases of the pool as large as the visible CPUs, by spin setting."""
    return {
        spin: case
        for (pool, spin), case in by_case(figures).items()
        if pool == figures["settings"]["visible_cpus"]
    }


def larger_pools(figures: dict) -> list[dict]:
    return [case for case in figures["cases"] if case["more_threads_than_cpus"]]


def throttled_range(figures: dict) -> str:
    values = [case["worker_cpu_ms_per_gap"] for case in larger_pools(figures)]
    return f"{min(values):.3f}-{max(values):.3f} ms"


def in_words(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers[:-1])) + f" and {numbers[-1]}"


def quoted_figures(text: str) -> set[str]:
    """Every figure with three decimals in ``text``: the measured CPU times."""
    return set(re.findall(r"\d+\.\d{3}", text))


def figures_measured(figures: dict) -> set[str]:
    return {f"{case['worker_cpu_ms_per_gap']:.3f}" for case in figures["cases"]}


def test_the_results_page_is_the_published_json():
    figures = published()
    cases, settings, host = by_case(figures), figures["settings"], figures["host"]
    page = (PUBLISHED / "README.md").read_text().split(GPU_HOST_SECTION)[0]
    rows = [line for line in page.splitlines() if re.match(r"\| \d", line)]
    assert rows == table_rows(figures)

    text = flat(page)
    started = datetime.fromisoformat(figures["started_at"])
    assert f"Measured on {started:%Y-%m-%d} at {started:%H:%M} UTC" in text
    assert f"at commit {figures['project']['commit'][:7]}" in text
    assert figures["project"]["dirty"] and "uncommitted edits" in text
    assert f"The {len(cases)} cases took {figures['wall_s']} s" in text
    assert f"| CPU | {host['cpus']} visible CPUs ({host['cpu_model']})" in text
    assert host["cpus"] == settings["visible_cpus"]
    assert f"| Kernel | Linux {host['kernel']} |" in text
    libgomp = host["libgomp"]
    assert (
        f"Python {host['python']}, torch {host['torch']} with its own libgomp "
        f"(`{libgomp['file']}`, built by {libgomp['built_by']}; it counted "
        f"{libgomp['cpus']} CPUs)" in text
    )
    assert (
        f"per pool of {in_words(settings['pool_threads'])} intra-op threads and per "
        f"spin setting, a fresh process on both CPUs: {WARMUP_CYCLES} warm-up and "
        f"{settings['cycles']} measured cycles of a parallel add "
        f"({ELEMENTS_PER_THREAD:,} elements per thread) followed by "
        f"{settings['gap_ms']:g} ms idle" in text
    )

    fit = fitting_pool(figures)
    assert (
        f"With {settings['visible_cpus']} threads on {settings['visible_cpus']} CPUs "
        f"the worker burns {ms(fit['default']['worker_cpu_ms_per_gap'])} per gap "
        f"with libgomp's default spin count, against "
        f"{ms(fit['0']['worker_cpu_ms_per_gap'])} with `GOMP_SPINCOUNT=0`" in text
    )
    assert fit["infinite"]["worker_sleeps_per_gap"] == 0
    infinite = ms(fit["infinite"]["worker_cpu_ms_per_gap"])
    assert f"gap ({infinite} per cycle) and never sleeps" in text
    larger = larger_pools(figures)
    pools = sorted({case["pool_threads"] for case in larger})
    assert pools == [3, 4, 8]
    assert min(case["worker_sleeps_per_gap"] for case in larger) >= 1
    assert (
        f"With 3, 4 or 8 threads each worker uses {throttled_range(figures)} per cycle "
        "and sleeps in every gap, in all three settings" in text
    )
    assert all(
        case["workers_that_ran"] == case["pool_threads"] - 1
        for case in figures["cases"]
    )
    assert quoted_figures(page) <= figures_measured(figures)


def test_the_gpu_hosts_measurement_is_its_published_json():
    """The page's section on the H200 host: its table, host, design and figures."""
    figures = published("spin_throttle_h200.json")
    settings, host, fit = figures["settings"], figures["host"], fitting_pool(figures)
    page = (PUBLISHED / "README.md").read_text().split(GPU_HOST_SECTION)[1]
    rows = [line for line in page.splitlines() if re.match(r"\| \d", line)]
    assert rows == table_rows(figures)
    text = flat(page)
    started = datetime.fromisoformat(figures["started_at"])
    assert f"Measured on {started:%Y-%m-%d} at {started:%H:%M} UTC" in text
    assert f"The {len(figures['cases'])} cases took {figures['wall_s']} s" in text
    assert "project" not in figures and "records no commit" in text
    pools = " ".join(map(str, settings["pool_threads"]))
    assert (
        f"--visible-cpus {settings['visible_cpus']} --pool-threads {pools} --cycles "
        f"{settings['cycles']} --gap-ms {settings['gap_ms']:g}`" in text
    )
    assert f"| CPU | {host['cpus']} visible CPUs ({host['cpu_model']}) |" in text
    assert f"| Kernel | Linux {host['kernel']} |" in text
    libgomp = host["libgomp"]
    assert (
        f"Python {host['python']}, torch {host['torch']} with its own libgomp "
        f"(`{libgomp['file']}`, built by {libgomp['built_by']}; it counted "
        f"{libgomp['cpus']} CPUs)" in text
    )
    assert (
        f"per pool of {in_words(settings['pool_threads'])} intra-op threads and per "
        f"spin setting, a fresh process on all {settings['visible_cpus']} CPUs: "
        f"{WARMUP_CYCLES} warm-up and {settings['cycles']} measured cycles of a "
        f"parallel add ({ELEMENTS_PER_THREAD:,} elements per thread) followed by "
        f"{settings['gap_ms']:g} ms idle" in text
    )
    workers = fit["default"]["workers_that_ran"]
    assert (
        f"With {settings['visible_cpus']} threads on {settings['visible_cpus']} CPUs "
        f"each of the {workers} workers burns "
        f"{ms(fit['default']['worker_cpu_ms_per_gap'])} per gap with libgomp's "
        f"default spin count, against {ms(fit['0']['worker_cpu_ms_per_gap'])} with "
        "`GOMP_SPINCOUNT=0`" in text
    )
    assert fit["infinite"]["worker_sleeps_per_gap"] == 0
    assert f"({ms(fit['infinite']['worker_cpu_ms_per_gap'])}) and never sleeps" in text
    larger = larger_pools(figures)
    pools = sorted({case["pool_threads"] for case in larger})
    assert min(case["worker_sleeps_per_gap"] for case in larger) >= 1
    assert (
        f"Pools of {in_words(pools)} threads use {throttled_range(figures)} per "
        "worker and cycle and sleep in every gap" in text
    )
    assert all(
        case["workers_that_ran"] == case["pool_threads"] - 1
        for case in figures["cases"]
    )
    assert quoted_figures(page) <= figures_measured(figures)


def test_the_gpu_host_page_explains_the_map_with_the_published_figures():
    figures = published()
    section = GPU_HOSTS.read_text().split("\n## Why a pool larger than the CPUs")[1]
    text = flat(section.split("\n## ")[0])
    assert (
        f"the spin count is {SPIN_COUNT:,} (about 3 ms by the source's own estimate) "
        f"and the throttled count {THROTTLED_SPIN_COUNT}; with `ACTIVE` the throttled "
        f"count is {THROTTLED_ACTIVE_SPIN_COUNT:,}" in text
    )
    host = figures["host"]
    assert (
        f"The copy torch {host['torch'].split('+')[0]} ships (built by "
        f"{host['libgomp']['built_by']}) stores the same {SPIN_COUNT:,}, "
        f"{THROTTLED_SPIN_COUNT} and {THROTTLED_ACTIVE_SPIN_COUNT:,}" in text
    )
    settings, fit = figures["settings"], fitting_pool(figures)
    cpu = {spin: ms(case["worker_cpu_ms_per_gap"]) for spin, case in fit.items()}
    assert (
        f"on {settings['visible_cpus']} visible CPUs, with a parallel add every "
        f"{settings['gap_ms']:g} ms, the worker of a {settings['visible_cpus']}-thread "
        f"pool burns {cpu['default']} of CPU per gap with the default spin, "
        f"{cpu['0']} with `GOMP_SPINCOUNT=0`, and {cpu['infinite']} (the whole gap, "
        "never sleeping)" in text
    )
    assert (
        f"Pools of 3, 4 and 8 threads use {throttled_range(figures)} per worker and "
        "gap in all three settings" in text
    )
    host_figures = published("spin_throttle_h200.json")
    on_the_host, settings = fitting_pool(host_figures), host_figures["settings"]
    cpu = {
        spin: ms(case["worker_cpu_ms_per_gap"]) for spin, case in on_the_host.items()
    }
    assert (
        f"On the H200 host itself ({settings['visible_cpus']} visible CPUs, a parallel "
        f"add every {settings['gap_ms']:g} ms) a {settings['visible_cpus']}-thread "
        f"pool's workers burn {cpu['default']} per gap with the default spin, "
        f"{cpu['0']} with `GOMP_SPINCOUNT=0` and {cpu['infinite']} with `infinite`; "
        f"pools of 17-128 threads use {throttled_range(host_figures)}" in text
    )
    assert quoted_figures(text) <= figures_measured(figures) | figures_measured(
        host_figures
    )
    # The study's quota and the GPU host's, as their configs give them.
    quotas = {
        name: next(
            arm["cpu_quota"]
            for arm in yaml.safe_load((ROOT / "config" / name).read_text())["arms"]
            if arm["name"] == "A"
        )
        for name in ("b1.yaml", "gpu-host.yaml")
    }
    assert f"under the {quotas['b1.yaml']}-core quota" in text
    assert f"(16 threads under {quotas['gpu-host.yaml']} cores)" in text
