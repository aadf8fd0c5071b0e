"""Benchmarks of the harness itself: only the server may limit what a run measures.

A benchmark harness can end up measuring itself: a Python client that cannot send
fast enough, a monitor that eats the CPU the server needs, a start-up that dwarfs the
measured window. Each module here measures one part of this harness and returns a
JSON-ready dict; `benchmark_run.run_benchmarks` gathers them, with the host they ran
on (`benchmark_host`), into `results/benchmarks/harness.json`:

* `client_roofline`: the client's highest sustained request rate and its
  time-to-first-token overhead, against the zero-work server (`zero_work`), the
  client pinned to one CPU and the server to another;
* `dispatch_lag`: that a client which falls behind its schedule makes a run invalid;
* `monitor_cost`: the CPU the run monitors use at their default rates, sampling a
  process tree with many threads inside a real cgroup;
* `shm_copy`: the copy into shared memory of each variant's own `ShmPointerMMData`
  beside this host's single-thread memcpy, in a fresh process with the server's
  default threads (`python -m serving_study.studies.harness shm-copy`);
* `arm_overhead`: the wall time of one real embedded arm beyond its measured
  window, phase by phase;
* `study_wall_time`: the wall time of the whole default study, from the
  `benchmark:` file Snakemake writes for each of its jobs.

Speeds are figures here, never test assertions: the host is shared and small, so every
benchmark also records how busy the host was while it ran.
"""
