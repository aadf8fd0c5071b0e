"""The preflight doctor names every fix for an arm in the trap, with what the
project's published fixes tables measured of each."""

import pandas as pd
from study_helpers import arm_record

from serving_study.analysis.fix_comparison import COLUMNS, TRAP
from serving_study.config.prescription import prescription
from serving_study.servers.host import arm_thread_plan


def write_fixes_table(root, experiment: str, rows: list[dict]):
    path = root / "docs" / "results" / experiment / "tables" / "fixes.csv"
    path.parent.mkdir(parents=True)
    pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(path, index=False)
    return path


def row(fix: str, vs_trap: float | None, free_cpu: float | None) -> dict:
    return {
        "fix": fix,
        "arm": "x",
        "throughput_vs_trap": vs_trap,
        "main_cpu_ms_per_request_without_quota": free_cpu,
    }


def test_every_fix_is_named_with_its_setting_and_cost():
    note = prescription(16, 1.7, [])
    for name, setting in (
        ("thread cap", "OMP_NUM_THREADS=1"),
        ("patch", "PR #48881"),
        ("passive wait", "OMP_WAIT_POLICY=PASSIVE"),
        ("no spin", "GOMP_SPINCOUNT=0"),
    ):
        line = next(line for line in note.splitlines() if f"- {name}:" in line)
        assert setting in line and "Cost: " in line
        assert "not measured by this project yet" in line
    assert note.startswith("16 intra-op threads under a 1.7-core quota")


def test_the_cap_follows_the_quota():
    assert "OMP_NUM_THREADS=8" in prescription(128, 8.5, [])


def test_what_a_results_page_measured_is_quoted(tmp_path):
    table = write_fixes_table(
        tmp_path,
        "gpu-host",
        [
            row(TRAP, 1.0, 250.0),
            row("passive wait (OMP_WAIT_POLICY=PASSIVE)", 1.97, 31.4),
            row("patch (PR #48881)", 1.95, None),
        ],
    )
    note = prescription(16, 1.7, [table])
    passive = next(line for line in note.splitlines() if "- passive wait:" in line)
    assert (
        "gpu-host: 1.97x the trap's throughput, 31 ms main-process CPU per request "
        "without a quota" in passive
    )
    patch = next(line for line in note.splitlines() if "- patch:" in line)
    assert "gpu-host: 1.95x the trap's throughput" in patch
    assert "without a quota" not in patch
    spin = next(line for line in note.splitlines() if "- no spin:" in line)
    assert "not measured by this project yet" in spin


def test_only_an_arm_in_the_trap_gets_the_prescription(tmp_path):
    arms = [
        arm_record(**arm)
        for arm in (
            {"name": "trap", "cpu_quota": 0.5, "environment": {}},
            {
                "name": "capped",
                "cpu_quota": 0.5,
                "environment": {"OMP_NUM_THREADS": "1"},
            },
            {"name": "free", "cpu_quota": "none", "environment": {}},
        )
    ]
    plan = {entry["arm"]: entry for entry in arm_thread_plan(arms, [])}
    assert "Fixes:" in plan["trap"]["warning"]
    assert "OMP_WAIT_POLICY=PASSIVE" in plan["trap"]["warning"]
    assert plan["capped"]["warning"] is None
    assert plan["free"]["warning"] is None
