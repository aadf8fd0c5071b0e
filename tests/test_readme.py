"""The README's two quick-start commands are the ones the project really uses."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines()]


def test_quick_start_is_exactly_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2
    assert commands[0].endswith("snakemake --cores 1 all")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci_script = (ROOT / ".ci" / "run").read_text().splitlines()
    assert quick_start_commands()[1] in [line.strip() for line in ci_script]


def test_gpu_host_headline_matches_the_committed_tables():
    """The README's GPU-host figures are the medians in docs/results/gpu-host."""
    import pandas as pd

    arms = pd.read_csv(ROOT / "docs" / "results" / "gpu-host" / "tables" / "arms.csv")
    medians = arms[arms["metric"] == "throughput_rps"].set_index("arm")["median"]
    text = (ROOT / "README.md").read_text()
    section = text.split("## On a GPU host", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ")]
    shown = {row[1].strip(): float(row[3]) for row in rows[1:]}
    assert set(shown) == {"A", "B", "C", "D", "E"}
    for arm, value in shown.items():
        assert value == round(medians[arm], 1), arm
    ratio = medians["A"] / medians["C"]
    assert f"A/C = {ratio:.2f}" in section


SGLANG_CPU = ROOT / "docs" / "results" / "sglang-cpu"


def markdown_rows(section: str) -> list[list[str]]:
    """The body rows of the markdown tables in ``section``, cells stripped."""
    rows = []
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return [row for row in rows if row[0] not in ("arm", "claim", "")]


def arm_medians(metric: str):
    import pandas as pd

    arms = pd.read_csv(SGLANG_CPU / "tables" / "arms.csv")
    return arms[arms["metric"] == metric].set_index("arm")["median"]


def test_real_server_figures_in_the_readme_match_the_committed_tables():
    import pandas as pd

    text = (ROOT / "README.md").read_text()
    section = text.split("## SGLang's real server on CPU", 1)[1].split("\n## ", 1)[0]
    throughput = arm_medians("throughput_rps")
    shown = {row[0]: float(row[3]) for row in markdown_rows(section) if len(row) == 4}
    assert set(shown) == set(throughput.index)
    for arm, value in shown.items():
        assert value == round(throughput[arm], 2), arm
    claims = pd.read_csv(SGLANG_CPU / "tables" / "claims.csv").set_index("claim")
    ratios = pd.read_csv(SGLANG_CPU / "tables" / "ratios.csv").set_index("claim")
    for claim, numerator, denominator in (
        ("patch-recovers-main-process", "C-main", "A-main"),
        ("thread-cap-recovers-main-process", "B-main", "A-main"),
    ):
        value, verdict = claims.loc[claim, "value"], claims.loc[claim, "verdict"]
        assert f"{numerator}/{denominator} = {value:.2f}x" in section
        line = next(
            line
            for line in section.split("\n- ")
            if line.startswith(f"{numerator}/{denominator}")
        )
        assert f"**{verdict}**" in line
        blocks = ratios.loc[claim, "block_ratios"]
        for block in blocks.split("; "):
            assert block.split()[1] in line, (claim, block)
    spread = claims.loc["whole-server-copy-is-not-the-bottleneck"]
    assert f"**{spread['verdict']}** (spread {100 * spread['value']:.1f}%)" in section


def test_the_real_server_results_page_matches_the_committed_tables():
    import pandas as pd

    page = (SGLANG_CPU / "README.md").read_text()
    throughput = arm_medians("throughput_rps")
    main_cpu = arm_medians("main_cpu_percent")
    scheduler_cpu = arm_medians("scheduler_cpu_percent")
    throttled = arm_medians("throttled_share")
    table = page.split("## Throughput and CPU", 1)[1].split("\n## ", 1)[0]
    rows = markdown_rows(table)
    assert {row[0] for row in rows} == set(throughput.index)
    for arm, _, rps, main, scheduler, share in rows:
        assert float(rps) == round(throughput[arm], 2), arm
        assert main == f"{main_cpu[arm]:.1f}%", arm
        assert scheduler == f"{scheduler_cpu[arm]:.1f}%", arm
        assert share == f"{100 * throttled[arm]:.0f}%", arm
    split = pd.read_csv(SGLANG_CPU / "tables" / "real_server.csv").set_index("arm")
    section = page.split("## Where the main process's CPU goes", 1)[1]
    section = section.split("\n## ", 1)[0]
    for row in markdown_rows(section):
        arm, start, overhead, main, processor, copy, rest, scheduler = row
        figures = split.loc[arm]
        assert start == f"{figures['start_to_healthy_s']:.1f} s", arm
        assert overhead == f"{figures['arm_overhead_s']:.1f} s", arm
        assert main == f"{figures['main_cpu_ms_per_request']:.1f} ms", arm
        assert processor == f"{figures['processor_cpu_ms']:.1f} ms", arm
        assert copy == f"{figures['shm_copy_cpu_ms']:.1f} ms", arm
        assert rest == f"{figures['rest_cpu_ms']:.1f} ms", arm
        assert scheduler == f"{figures['scheduler_cpu_ms_per_request']:.0f} ms", arm
    claims = pd.read_csv(SGLANG_CPU / "tables" / "claims.csv")
    verdicts = page.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    for claim in claims.itertuples():
        (row,) = [
            row for row in markdown_rows(verdicts) if row[0].startswith(claim.claim)
        ]
        assert row[-1] == claim.verdict, claim.claim


DEFAULT = ROOT / "docs" / "results" / "embedded-b1"


def test_default_run_figures_in_the_readme_match_the_committed_tables():
    import pandas as pd

    arms = pd.read_csv(DEFAULT / "tables" / "arms.csv")

    def summary(metric: str):
        return arms[arms["metric"] == metric].set_index("arm")

    throughput = summary("throughput_rps")
    ttft = summary("ttft_p50_ms")["median"]
    cpu = summary("main_cpu_ms_per_request")["median"]
    others = summary("other_threads_cpu_percent")["median"]
    text = (ROOT / "README.md").read_text()
    section = text.split("## What the default run shows", 1)[1].split("\n## ", 1)[0]
    rows = [row for row in markdown_rows(section) if len(row) == 6]
    assert {row[0] for row in rows} == set(throughput.index)
    for arm, _, rps, latency, per_request, other in rows:
        low, high = throughput.loc[arm, "min"], throughput.loc[arm, "max"]
        median = throughput.loc[arm, "median"]
        assert rps == f"{median:.1f} [{low:.1f}-{high:.1f}]", arm
        assert latency == f"{ttft[arm]:.0f} ms", arm
        assert per_request == f"{cpu[arm]:.1f} ms", arm
        assert other == f"{others[arm]:.1f}%", arm
    claims = pd.read_csv(DEFAULT / "tables" / "claims.csv").set_index("claim")
    for claim, shown in (
        ("patch-recovers-throughput", "C/A"),
        ("thread-cap-recovers-throughput", "B/A"),
        ("passive-wait-recovers-throughput", "A-passive/A"),
        ("no-spin-recovers-throughput", "A-spin0/A"),
    ):
        value, verdict = claims.loc[claim, "value"], claims.loc[claim, "verdict"]
        assert f"- {shown} = {value:.2f}x: **{verdict}**" in section, claim
    spread = claims.loc["fixes-agree"]
    assert f"**{spread['verdict']}** (spread {100 * spread['value']:.1f}%)" in section
    cost = claims.loc["original-costs-cpu-without-quota"]
    assert f"**{cost['verdict']}**" in section
    assert f"({cost['value']:.2f}x" in section.replace("\n  ", " ")


FIXES_ON_CPU = ROOT / "docs" / "results" / "sglang-cpu-fixes"


def test_real_server_fix_figures_in_the_readme_match_the_committed_tables():
    import pandas as pd

    arms = pd.read_csv(FIXES_ON_CPU / "tables" / "arms.csv")

    def medians(metric: str):
        return arms[arms["metric"] == metric].set_index("arm")["median"]

    throughput = medians("throughput_rps")
    cpu = medians("main_cpu_ms_per_request")
    others = medians("other_threads_cpu_percent")
    text = (ROOT / "README.md").read_text()
    section = text.split("### Every fix on the real server", 1)[1].split("\n## ", 1)[0]
    rows = [row for row in markdown_rows(section) if len(row) == 5]
    assert {row[0] for row in rows} == set(throughput.index)
    for arm, _, rps, per_request, other in rows:
        assert rps == f"{throughput[arm]:.2f}", arm
        assert per_request == f"{cpu[arm]:.1f} ms", arm
        assert other == f"{others[arm]:.1f}%", arm
    claims = pd.read_csv(FIXES_ON_CPU / "tables" / "claims.csv")
    flat = section.replace("\n  ", " ")
    for claim in claims.itertuples():
        line = next(line for line in flat.split("\n- ") if f"{claim.claim})" in line)
        assert f"**{claim.verdict}**" in line, claim.claim
        if claim.kind == "ratio":
            assert f"{claim.value:.2f}x" in line, claim.claim
        else:
            assert f"spread {100 * claim.value:.1f}%" in line, claim.claim
