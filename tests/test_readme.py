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
