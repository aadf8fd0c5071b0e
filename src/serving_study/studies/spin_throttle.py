"""How much CPU torch's OpenMP workers burn after a parallel region, by pool size.

torch runs its intra-op pool on libgomp (the copy its wheel bundles in torch/lib).
A worker that finished a parallel region spins before it sleeps on a futex, and
libgomp picks how long when it waits: the full spin count (GOMP_SPINCOUNT) while
the threads it manages are no more than the CPUs in the affinity mask it read when
it loaded, a throttled one (a hundred spins) once they are more. A pool that fits
the visible CPUs burns CPU in every idle gap; one that outnumbers them hardly
spins. docs/gpu-hosts.md cites the source and quotes these figures.

Each case is a fresh process, since libgomp reads its environment and counts the
CPUs once, when it loads: restricted to the first ``visible_cpus`` CPUs before
torch is imported, with ``pool_threads`` intra-op threads, it repeats a parallel
add followed by an idle gap, and reads from /proc what the threads other than the
main one did meanwhile: their CPU time and how often they went to sleep. Each pool
runs with libgomp's default spin, with ``GOMP_SPINCOUNT=0`` (no spin: the floor)
and with ``GOMP_SPINCOUNT=infinite`` (a worker that is not throttled never sleeps).
Standard library and torch only, so that it runs on a host with nothing else::

    PYTHONPATH=src python -m serving_study.studies.spin_throttle measure \\
        --visible-cpus 16 --pool-threads 16 17 32 64 128 --output spin_throttle.json
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from serving_study.measure.thread_cpu import read_thread_run_time, read_thread_sleeps

# The GOMP_SPINCOUNT each pool runs with (None: unset, libgomp's default).
SPIN_COUNTS = {"default": None, "0": "0", "infinite": "infinite"}
# Elements per thread in torch's parallel add: ATen's grain size (at::internal::
# GRAIN_SIZE), so that every thread of the pool gets a share.
ELEMENTS_PER_THREAD = 32768
WARMUP_CYCLES = 3
# Each case runs this module in a fresh interpreter (``__name__`` is __main__ there).
MODULE = "serving_study.studies.spin_throttle"
# Where a library names the GCC that built it: the .comment section, or (stripped,
# as in torch's wheels) the notes of GCC's annobin plugin.
GCC_VERSION = re.compile(rb"(?:GCC: \([^)]*\)|running gcc) ([0-9]+\.[0-9]+\.[0-9]+)")


@dataclass(frozen=True)
class SpinThrottleSettings:
    """The measurement's settings (the config's ``spin_throttle``)."""

    visible_cpus: int
    pool_threads: tuple[int, ...]
    cycles: int
    gap_ms: float

    @classmethod
    def from_config(cls, section: Mapping) -> SpinThrottleSettings:
        # Imported here: the schema needs PyYAML, and the command line runs where
        # torch may be the only package installed.
        from serving_study.config.record_fields import config_values

        names = [field.name for field in dataclasses.fields(cls)]
        values = config_values(section, names, "spin_throttle")
        return cls(
            visible_cpus=int(values["visible_cpus"]),
            pool_threads=tuple(int(threads) for threads in values["pool_threads"]),
            cycles=int(values["cycles"]),
            gap_ms=float(values["gap_ms"]),
        )

    def as_config(self) -> dict:
        return dataclasses.asdict(self) | {"pool_threads": list(self.pool_threads)}


def worker_figures(
    start: dict[int, tuple[int, int]],
    end: dict[int, tuple[int, int]],
    main_thread: int,
    pool_threads: int,
    cycles: int,
) -> dict:
    """What the pool's workers did between two readings of every thread's (CPU ns,
    times it went to sleep): how many ran, and per worker and cycle (one parallel
    op and the idle gap after it) the CPU they used and how often they slept. A
    thread that started in between counts from zero."""
    cpu_ns = sleeps = ran = 0
    for thread, (cpu_then, sleeps_then) in end.items():
        cpu_before, sleeps_before = start.get(thread, (0, 0))
        if thread != main_thread and cpu_then > cpu_before:
            ran += 1
            cpu_ns += cpu_then - cpu_before
            sleeps += sleeps_then - sleeps_before
    per_worker_cycle = max(1, (pool_threads - 1) * cycles)
    return {
        "workers_that_ran": ran,
        "worker_cpu_ms_per_gap": round(cpu_ns / 1e6 / per_worker_cycle, 4),
        "worker_sleeps_per_gap": round(sleeps / per_worker_cycle, 3),
    }


def thread_readings(pid: int) -> dict[int, tuple[int, int]]:
    """Every thread's CPU time so far (ns) and how often it has gone to sleep."""
    cpu, sleeps = read_thread_run_time(pid), read_thread_sleeps(pid)
    return {thread: (ns, sleeps.get(thread, 0)) for thread, ns in cpu.items()}


def loaded_libgomp() -> dict:
    """The libgomp this process loaded (torch's own, as a rule): its file, the GCC
    that built it, and the CPUs it counts (omp_get_num_procs)."""
    maps = Path("/proc/self/maps").read_text().split()
    path = next((Path(word) for word in maps if "libgomp" in Path(word).name), None)
    if path is None:
        return {"file": None, "sha256": None, "built_by": None, "cpus": None}
    library = path.read_bytes()
    built_by = GCC_VERSION.search(library)
    return {
        "file": "/".join(path.parts[-3:]),
        "sha256": hashlib.sha256(library).hexdigest(),
        "built_by": f"GCC {built_by.group(1).decode()}" if built_by else None,
        "cpus": ctypes.CDLL(str(path)).omp_get_num_procs(),
    }


def probe(cpus: list[int], pool_threads: int, cycles: int, gap_s: float) -> dict:
    """One case, in this fresh process: see the module's docstring."""
    os.sched_setaffinity(0, cpus)
    import torch  # only now: libgomp counts the CPUs it may use when it loads

    torch.set_num_threads(pool_threads)
    operand = torch.ones(pool_threads * ELEMENTS_PER_THREAD)
    result = torch.empty_like(operand)
    for _ in range(WARMUP_CYCLES):
        torch.add(operand, operand, out=result)
        time.sleep(gap_s)
    start = thread_readings(os.getpid())
    for _ in range(cycles):
        torch.add(operand, operand, out=result)
        time.sleep(gap_s)
    end = thread_readings(os.getpid())
    return {
        "torch": torch.__version__,
        "libgomp": loaded_libgomp(),
        "visible_cpus": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        **worker_figures(start, end, os.getpid(), pool_threads, cycles),
    }


def case_environment(spin_count: str | None) -> dict[str, str]:
    """This process's environment without OpenMP settings, GOMP_SPINCOUNT set when
    given, and this package on the child's path."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("OMP_", "GOMP_"))
    }
    if spin_count is not None:
        environment["GOMP_SPINCOUNT"] = spin_count
    package_root = str(Path(__file__).resolve().parents[2])
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [package_root, environment.get("PYTHONPATH")])
    )
    return environment


def measure_case(
    cpus: list[int], pool_threads: int, spin: str, settings: SpinThrottleSettings
) -> dict:
    command = [sys.executable, "-m", MODULE, "probe"]
    command += ["--cpus", ",".join(map(str, cpus)), "--pool-threads", str(pool_threads)]
    command += ["--cycles", str(settings.cycles), "--gap-ms", str(settings.gap_ms)]
    finished = subprocess.run(
        command,
        env=case_environment(SPIN_COUNTS[spin]),
        capture_output=True,
        text=True,
    )
    if finished.returncode != 0:
        raise RuntimeError(
            f"the case of {pool_threads} threads, spin {spin} failed "
            f"(exit {finished.returncode}):\n{finished.stderr[-2000:]}"
        )
    return {"pool_threads": pool_threads, "spin_count": spin} | json.loads(
        finished.stdout
    )


def measure_spin_throttle(settings: SpinThrottleSettings) -> dict:
    """Every (pool, spin setting) case on the first ``visible_cpus`` CPUs."""
    available = sorted(os.sched_getaffinity(0))
    if settings.visible_cpus > len(available):
        raise ValueError(
            f"spin_throttle.visible_cpus is {settings.visible_cpus}, but this "
            f"process may use only {len(available)} CPUs"
        )
    cpus = available[: settings.visible_cpus]
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.monotonic()
    cases = [
        measure_case(cpus, pool, spin, settings)
        for pool in settings.pool_threads
        for spin in SPIN_COUNTS
    ]
    # Every case loaded the same torch and libgomp: the host names them once.
    for case in cases:
        torch_version, libgomp = case.pop("torch"), case.pop("libgomp")
        case["more_threads_than_cpus"] = case["pool_threads"] > case["visible_cpus"]
    return {
        "host": {
            "kernel": platform.release(),
            "cpu_model": cpu_model(),
            "cpus": len(available),
            "python": platform.python_version(),
            "torch": torch_version,
            "libgomp": libgomp,
        },
        "settings": settings.as_config(),
        "cases": cases,
        "started_at": started_at,
        "wall_s": round(time.monotonic() - started, 1),
    }


def cpu_model() -> str | None:
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("measure", help="every case; write JSON")
    measure.add_argument("--visible-cpus", type=int, required=True)
    measure.add_argument("--pool-threads", type=int, nargs="+", required=True)
    measure.add_argument("--cycles", type=int, required=True)
    measure.add_argument("--gap-ms", type=float, required=True)
    measure.add_argument("--output", type=Path, required=True)
    one = commands.add_parser("probe", help="one case in this process; print JSON")
    one.add_argument("--cpus", required=True, help="comma-separated CPU numbers")
    one.add_argument("--pool-threads", type=int, required=True)
    one.add_argument("--cycles", type=int, required=True)
    one.add_argument("--gap-ms", type=float, required=True)
    arguments = parser.parse_args(argv)
    if arguments.command == "probe":
        cpus = [int(cpu) for cpu in arguments.cpus.split(",")]
        figures = probe(
            cpus, arguments.pool_threads, arguments.cycles, arguments.gap_ms / 1000
        )
        print(json.dumps(figures))
        return 0
    settings = SpinThrottleSettings(
        arguments.visible_cpus,
        tuple(arguments.pool_threads),
        arguments.cycles,
        arguments.gap_ms,
    )
    figures = measure_spin_throttle(settings)
    arguments.output.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
