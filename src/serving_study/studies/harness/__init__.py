"""Benchmarks of the harness itself: only the server may limit what a run measures.

A benchmark harness can end up measuring itself: a Python client that cannot send
fast enough, a monitor that eats the CPU the server needs, a start-up that dwarfs the
measured window. Each module here measures one part of this harness (the client
against a zero-work server, a client that falls behind, the monitors, the copy into
shared memory, one real arm's overhead, the whole study's wall time) and returns a
JSON-ready dict; `benchmark_run.run_benchmarks` gathers them, with the host they ran
on (`benchmark_host`), into `results/benchmarks/harness.json`.

Speeds are figures here, never test assertions: the host is shared and small, so every
benchmark also records how busy the host was while it ran.
"""
