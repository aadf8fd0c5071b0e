"""On a cgroup v2 host (the lent GPU machine): where the runner's CPU-quota group
is made, that its quota binds a busy loop, and that cgroup.kill empties it.

Run as root from the project root:
``PYTHONPATH=src python tests/gpu/cgroup_v2_check.py``
(``SERVING_STUDY_CGROUPS_AT_ROOT=1`` to allow the hierarchy's root). Prints JSON.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

from serving_study.servers.cgroup_hierarchy import QuotaUnavailable, layout_for
from serving_study.servers.cgroups import CpuQuotaGroup, wrap_command

BUSY = [sys.executable, "-c", "while True: pass"]
report = {"own_cgroup": str(layout_for("self").cpu_directory)}
try:
    group = CpuQuotaGroup.create(f"v2-check-{time.monotonic_ns()}", 0.5)
except QuotaUnavailable as refused:
    report["refused"] = str(refused)
    print(json.dumps(report, indent=2))
    sys.exit(0)
report["group"] = str(group.cpu_directory)
report["own_cgroup_after"] = str(layout_for("self").cpu_directory)
loops = [subprocess.Popen(wrap_command(group, BUSY)) for _ in range(2)]
before = group.read_stat()
time.sleep(3)
report["quota"] = before.delta(group.read_stat())
started = time.monotonic()
group.remove()
report["removed_in_s"] = round(time.monotonic() - started, 3)
report["loops_exit"] = [loop.wait(timeout=10) for loop in loops]
report["parent_kept"] = Path(report["group"]).parent.exists()
print(json.dumps(report, indent=2))
