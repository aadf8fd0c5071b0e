"""The README and the pages under docs/ say what the project really does: the
quick start's commands are the ones CI runs, every figure quoted matches the published
tables under docs/results/, the README stays short, and every link resolves."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def section(page: Path, heading: str) -> str:
    """The text of ``page`` under ``heading``, up to the next heading of any level."""
    text = page.read_text()
    assert f"\n{heading}" in text, (page.name, heading)
    body = text.split(f"\n{heading}", 1)[1]
    return re.split(r"\n#+ ", body, maxsplit=1)[0]


def flat(text: str) -> str:
    """``text`` with its line breaks and indentation folded into single spaces."""
    return " ".join(text.split())


def quick_start_commands() -> list[str]:
    block = section(README, "## Quick start").split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines()]


def test_quick_start_is_exactly_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2
    assert commands[0].endswith("snakemake --cores 1 all")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci_script = (ROOT / ".ci" / "run").read_text().splitlines()
    assert quick_start_commands()[1] in [line.strip() for line in ci_script]


def test_the_readme_stays_short():
    assert len(README.read_text().splitlines()) <= 150


def anchor(heading: str) -> str:
    """The fragment GitHub gives a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {anchor(line.lstrip("#")) for line in text.splitlines() if line[:1] == "#"}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), (page.name, target)
        if fragment:
            assert fragment in headings(linked), (page.name, target)


def test_the_readme_links_every_docs_page():
    linked = {target.split("#")[0] for target in LINK.findall(README.read_text())}
    assert {f"docs/{page.name}" for page in DOCS.glob("*.md")} <= linked


def test_the_readme_names_its_stand_ins():
    status = flat(README.read_text().split("\n## ", 1)[0])
    assert "**timed stand-in model**" in status
    assert "**stand-in for sgl-kernel's CPU ops**" in status
    real_server = flat(section(README, "## SGLang's real server on CPU"))
    assert (
        "**stand-in**: a tiny Qwen3-VL with random weights, one output" in real_server
    )
    assert "same stand-in" in flat(section(README, "## Every fix on the real server"))


GPU_HOST = ROOT / "docs" / "results" / "gpu-host"
GPU_HOST_REAL = ROOT / "docs" / "results" / "gpu-host-real"
VERDICTS = "## Verdicts, and where each bound came from"


def arm_figures(results: Path, metric: str):
    """One metric of a results page's ``arms.csv``: median, min, max... per arm."""
    import pandas as pd

    arms = pd.read_csv(results / "tables" / "arms.csv")
    return arms[arms["metric"] == metric].set_index("arm")


def gpu_host_claims():
    import pandas as pd

    return pd.read_csv(GPU_HOST / "tables" / "claims.csv").set_index("claim")


def paired_count(detail: str) -> str:
    """ "k of n" from a claim's detail ("...; 1 of 5 paired runs meet it; ...")."""
    return re.search(r"(\d+ of \d+) paired runs", detail).group(1)


def span(*figures: float) -> str:
    """Figures as a page writes their range to one decimal: "3.3-3.4", or "3.2"
    when they round alike."""
    low, high = f"{min(figures):.1f}", f"{max(figures):.1f}"
    return low if low == high else f"{low}-{high}"


def judged(row) -> str:
    """What a page writes beside a verdict: "a test of a bound from the study", from
    the claims table's judged_as and the words that open its bound_from."""
    return f"a {row['judged_as']} of a bound from {row['bound_from'].split(': ')[0]}"


def verdict_words(row) -> str:
    """A verdict as the pages write it, with what it is beside it."""
    return f"**{row['verdict']}**, {judged(row)}"


def each_of(row) -> str:
    """ "tests, each of a bound from the study": a kind of verdict, for several."""
    return judged(row).removeprefix("a ").replace(" of a bound", "s, each of a bound")


def ratio_claim_line(claims, claim: str) -> str:
    """How a ratio claim is stated beside its figure: value, bound, verdict, what
    the verdict is, blocks."""
    row = claims.loc[claim]
    numerator, denominator = row["arms"].split(", ")
    return (
        f'{numerator}/{denominator} = {row["value"]:.3f}x against "{row["bound"]}": '
        f"{verdict_words(row)} ({paired_count(row['detail'])} blocks"
    )


def test_gpu_host_figures_match_the_committed_tables():
    """docs/gpu-hosts.md's figures and verdicts are those in docs/results/gpu-host."""
    claims = gpu_host_claims()
    throughput = arm_figures(GPU_HOST, "throughput_rps")["median"]
    text = flat(section(DOCS / "gpu-hosts.md", "## The embedded engine on a GPU host"))
    rows = markdown_rows(
        section(DOCS / "gpu-hosts.md", "## The embedded engine on a GPU host")
    )
    shown = {row[0]: row for row in rows}
    assert set(shown) == {"A", "B", "C", "D", "E"}
    for arm, (_, _, rps, ttft, main, throttled) in shown.items():
        assert float(rps) == round(throughput[arm], 1), arm
        assert (
            ttft == f"{arm_figures(GPU_HOST, 'ttft_p50_ms').loc[arm, 'median']:.0f} ms"
        )
        assert (
            main
            == f"{arm_figures(GPU_HOST, 'main_cpu_percent').loc[arm, 'median']:.0f}%"
        )
        share = arm_figures(GPU_HOST, "throttled_share").loc[arm, "median"]
        assert throttled == f"{100 * share:.0f}%", arm
    for claim in (
        "fan-out-halves-throughput",
        "patch-recovers-throughput",
        "thread-cap-recovers-throughput",
        "passive-wait-recovers-throughput",
        "no-spin-recovers-throughput",
    ):
        assert ratio_claim_line(claims, claim) in text, claim
    cost = claims.loc["original-costs-cpu-without-quota"]
    assert (
        f'= {cost["value"]:.3f}x against "{cost["bound"]}": {verdict_words(cost)} '
        in text
    )
    same = claims.loc["same-throughput-without-quota"]
    assert f"(spread {100 * same['value']:.1f}%)" in text
    for claims_of, who in (
        (["fan-out-halves-throughput", "patch-recovers-throughput"], "The study's"),
        (
            ["passive-wait-recovers-throughput", "no-spin-recovers-throughput"],
            "the fixes'",
        ),
    ):
        (kind,) = {each_of(claims.loc[claim]) for claim in claims_of}
        assert f"{who} claims are {kind}," in text, who


def test_the_gpu_host_results_page_matches_the_committed_tables():
    """Every row of the results page's two tables is the workflow's own figure."""
    claims = gpu_host_claims()
    page = GPU_HOST / "README.md"
    throughput = arm_figures(GPU_HOST, "throughput_rps")
    rows = markdown_rows(
        section(page, "## The 2x2, cuda_ipc and every fix at the study's ratio")
    )
    assert {row[0] for row in rows} == set(throughput.index)
    for arm, _, rps, ttft, main, per_request, throttled in rows:
        figures = throughput.loc[arm]
        assert rps == (
            f"{figures['median']:.1f} [{figures['min']:.1f}-{figures['max']:.1f}]"
        ), arm
        assert (
            ttft == f"{arm_figures(GPU_HOST, 'ttft_p50_ms').loc[arm, 'median']:.0f} ms"
        )
        assert (
            main
            == f"{arm_figures(GPU_HOST, 'main_cpu_percent').loc[arm, 'median']:.0f}%"
        )
        cost = arm_figures(GPU_HOST, "main_cpu_ms_per_request").loc[arm, "median"]
        assert per_request == f"{cost:.1f} ms", arm
        share = arm_figures(GPU_HOST, "throttled_share").loc[arm, "median"]
        assert throttled == ("–" if share != share else f"{100 * share:.0f}%"), arm
    verdicts = markdown_rows(section(page, VERDICTS))
    assert len(verdicts) == len(claims)
    for name_and_arms, bound, value, meeting, verdict, *_ in verdicts:
        claim = claims.loc[name_and_arms.split(" (")[0]]
        assert (bound, verdict) == (claim["bound"], claim["verdict"]), name_and_arms
        if claim["kind"] == "ratio":
            assert value == f"{claim['value']:.3f}x", name_and_arms
            assert meeting == paired_count(claim["detail"]), name_and_arms
        else:
            assert value == f"spread {100 * claim['value']:.1f}%", name_and_arms
    text = flat(page.read_text())
    free = throughput["median"]
    spread = 100 * claims.loc["same-throughput-without-quota", "value"]
    both = f"{free['A-free']:.1f} and {free['C-free']:.1f} req/s"
    assert f"A-free and C-free serve the same ({both}, within {spread:.1f}%)" in text
    assert f"(A/C {claims.loc['fan-out-halves-throughput', 'value']:.3f}" in text


def gpu_host_map():
    """The GPU host's map: its cells, contrast and contrast per quota."""
    import pandas as pd

    def table(name: str):
        return pd.read_csv(
            GPU_HOST / "tables" / f"{name}.csv", dtype={"cpu_quota": str}
        )

    return (
        table("thread_quota_map"),
        table("thread_quota_map_contrast").set_index(["cpu_quota", "intra_op_threads"]),
        table("thread_quota_map_by_quota").set_index("cpu_quota"),
    )


def test_the_gpu_host_map_figures_are_the_map_tables():
    """The results page's and docs/gpu-hosts.md's map figures are the workflow's."""
    cells, contrast, by_quota = gpu_host_map()
    page = GPU_HOST / "README.md"
    body = section(page, "## The thread x quota map")
    rows = markdown_rows(body)[1:]
    assert [row[0] for row in rows] == by_quota.index.tolist()
    for quota, smallest, largest, at, below, above in rows:
        line = by_quota.loc[quota]
        assert (smallest, largest) == (
            f"{line['ratio_min']:.3f}",
            f"{line['ratio_max']:.3f}",
        ), quota
        assert at == str(line["threads_at_max"]), quota
        assert below == f"{line['blocks_below_1']} of {line['paired_blocks']}", quota
        assert above == str(line["blocks_above_1"]), quota
    text = flat(body)
    assert f"{cells['valid'].sum()} of {len(cells)} cells valid" in text
    trap = contrast.loc[("1", 16)]
    blocks = trap["block_ratios"].replace(";", " and ")
    # The table's ratio is the median of the blocks' ratios, not the ratio of medians.
    of_medians = trap["compared_rps"] / trap["baseline_rps"]
    assert (
        f"original copy served {trap['baseline_rps']:.1f} req/s and the patched "
        f"{trap['compared_rps']:.1f}, {of_medians:.2f}x the original's median (the "
        f"blocks' ratios are {blocks}, {trap['ratio']:.3f}x their median" in text
    )
    beyond_cpus = contrast.loc["1"].loc[[32, 64, 128], "ratio"]
    crowded = f"{beyond_cpus.min():.3f}-{beyond_cpus.max():.3f}x"
    assert (
        f"32-128 threads on 16 CPUs under 1 core the loss nearly vanishes ({crowded})"
        in text
    )
    free, sixteen = by_quota.loc["none"], by_quota.loc["16"]
    free_range = f"{free['ratio_min']:.3f}-{free['ratio_max']:.3f}"
    assert (
        f"its ratio is {free_range} and {free['blocks_below_1']} of "
        f"{free['paired_blocks']} paired blocks fall below 1; with 16 cores, "
        f"{sixteen['blocks_below_1']} of {sixteen['paired_blocks']}" in text
    )
    docs = flat(section(DOCS / "gpu-hosts.md", "## The embedded engine on a GPU host"))
    assert f"blocks ({cells['valid'].sum()} of {len(cells)} cells valid)" in docs
    assert (
        f"patched copy serves {trap['ratio']:.3f}x the original (the median of its "
        "blocks' ratios)" in docs
    )
    assert f"at most {beyond_cpus.max():.3f}x" in docs
    assert (
        f"without a quota {free_range}x ({free['blocks_below_1']} of "
        f"{free['paired_blocks']} paired blocks below 1)" in docs
    )


def test_the_gpu_host_map_tables_follow_from_its_committed_blocks():
    """The published map tables are what the workflow's code makes of the raw
    blocks beside them, and the published page draws them."""
    import json

    import pandas as pd

    from serving_study.analysis.map_contrast import contrast_by_quota, map_contrast
    from serving_study.studies.thread_quota_map import map_table

    blocks = [
        json.loads(path.read_text())
        for path in sorted((GPU_HOST / "thread-quota-map").glob("block*.json"))
    ]
    cells = map_table(blocks)
    contrast = map_contrast(cells, ["original", "patched"])
    published = pd.read_csv(GPU_HOST / "tables" / "thread_quota_map_by_quota.csv")
    recomputed = contrast_by_quota(contrast)
    recomputed["cpu_quota"] = recomputed["cpu_quota"].astype(str)
    published["cpu_quota"] = published["cpu_quota"].astype(str)
    pd.testing.assert_frame_equal(recomputed, published, check_dtype=False)
    assert len(blocks) == 2 and len(cells) == sum(len(block) for block in blocks)
    page = (GPU_HOST / "report.html").read_text()
    assert "Thread x quota map: the variants compared per quota" in page
    assert "Which fix: throughput, latency and CPU cost of each" in page


def test_the_readme_gpu_host_headline_matches_the_committed_tables():
    claims = gpu_host_claims()
    throughput = arm_figures(GPU_HOST, "throughput_rps")["median"]
    text = flat(section(README, "## On a GPU host"))
    assert (
        f"A {throughput['A']:.1f} req/s, B {throughput['B']:.1f}, "
        f"C {throughput['C']:.1f}, E (cuda_ipc) {throughput['E']:.1f}"
    ) in text
    for claims_on_a_line in (
        ["fan-out-halves-throughput"],
        ["patch-recovers-throughput", "thread-cap-recovers-throughput"],
        ["passive-wait-recovers-throughput", "no-spin-recovers-throughput"],
        ["original-costs-cpu-without-quota"],
    ):
        rows = [claims.loc[claim] for claim in claims_on_a_line]
        line = next(
            line for line in text.split("- ") if f"= {rows[0]['value']:.3f}x" in line
        )
        for row in rows:
            assert f"{row['value']:.3f}x" in line
            assert f'against "{row["bound"]}": {verdict_words(row)}' in line
            assert paired_count(row["detail"]).split(" of ")[0] in line


SGLANG_CPU = ROOT / "docs" / "results" / "sglang-cpu"


def markdown_rows(text: str) -> list[list[str]]:
    """The body rows of the markdown tables in ``text``, cells stripped."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return [row for row in rows if row[0] not in ("arm", "claim", "")]


def arm_medians(metric: str):
    return arm_figures(SGLANG_CPU, metric)["median"]


def test_real_server_figures_in_the_readme_match_the_committed_tables():
    import pandas as pd

    text = section(README, "## SGLang's real server on CPU")
    throughput = arm_medians("throughput_rps")
    shown = {row[0]: float(row[3]) for row in markdown_rows(text) if len(row) == 4}
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
        bound = claims.loc[claim, "bound"]
        assert f'{numerator}/{denominator} = {value:.2f}x against "{bound}"' in text
        line = next(
            line
            for line in text.split("\n- ")
            if line.startswith(f"{numerator}/{denominator}")
        )
        assert f"**{verdict}**" in line
        assert verdict_words(claims.loc[claim]) in line
        blocks = ratios.loc[claim, "block_ratios"]
        for block in blocks.split("; "):
            assert block.split()[1] in line, (claim, block)
    spread = claims.loc["whole-server-copy-is-not-the-bottleneck"]
    assert f"{verdict_words(spread)} (spread {100 * spread['value']:.1f}%)" in text


def test_real_server_cpu_split_in_the_docs_matches_the_committed_tables():
    import pandas as pd

    split = pd.read_csv(SGLANG_CPU / "tables" / "real_server.csv").set_index("arm")
    text = flat(section(DOCS / "real-server-on-cpu.md", "## What was measured"))
    main = split["main_cpu_ms_per_request"]
    assert (
        f"costs it {main['A-main']:.1f} ms of CPU per request "
        f"against {main['C-main']:.1f} ms for the patched copy"
    ) in text
    processor = split["processor_cpu_ms"]
    others = processor.drop("A-main")[["B-main", "C-main", "D-main"]]
    assert (
        f"({processor['A-main']:.1f} ms for the processor after the original copy, "
        f"{others.min():.1f}-{others.max():.1f} ms otherwise)"
    ) in text
    for column, words in (
        ("start_to_healthy_s", "start to healthy"),
        ("arm_overhead_s", "arm overhead"),
    ):
        low, high = split[column].min(), split[column].max()
        assert f"{words} {low:.0f}-{high:.0f} s" in text, column


def test_the_real_server_results_page_matches_the_committed_tables():
    import pandas as pd

    page = SGLANG_CPU / "README.md"
    throughput = arm_medians("throughput_rps")
    main_cpu = arm_medians("main_cpu_percent")
    scheduler_cpu = arm_medians("scheduler_cpu_percent")
    throttled = arm_medians("throttled_share")
    rows = markdown_rows(section(page, "## Throughput and CPU"))
    assert {row[0] for row in rows} == set(throughput.index)
    for arm, _, rps, main, scheduler, share in rows:
        assert float(rps) == round(throughput[arm], 2), arm
        assert main == f"{main_cpu[arm]:.1f}%", arm
        assert scheduler == f"{scheduler_cpu[arm]:.1f}%", arm
        assert share == f"{100 * throttled[arm]:.0f}%", arm
    split = pd.read_csv(SGLANG_CPU / "tables" / "real_server.csv").set_index("arm")
    for row in markdown_rows(section(page, "## Where the main process's CPU goes")):
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
    verdicts = markdown_rows(section(page, VERDICTS))
    for claim in claims.itertuples():
        (row,) = [row for row in verdicts if row[0].startswith(claim.claim)]
        assert row[4] == claim.verdict, claim.claim


DEFAULT = ROOT / "docs" / "results" / "embedded-b1"


def runs_wall_s(results: Path) -> float:
    """A results page's runs' wall times, summed from their provenance."""
    import json

    return sum(
        json.loads(path.read_text())["wall_s"]
        for path in (results / "runs").glob("*/run*/provenance.json")
    )


def runs_stated_on_the_page(results: Path, text: str) -> bool:
    """Whether a results page states its runs as its tables hold them: how many, of
    how many arms and runs each, all valid, and their summed wall time."""
    import pandas as pd

    runs = pd.read_csv(results / "tables" / "runs.csv")
    shape = f"{runs['arm'].nunique()} arms x {runs['run'].nunique()}"
    minutes, seconds = divmod(round(runs_wall_s(results)), 60)
    return (
        runs["valid"].all()
        and f"{len(runs)} runs ({shape}," in text
        and f"the runs took {minutes} min {seconds} s together" in text
    )


def default_run_medians():
    return lambda metric: arm_figures(DEFAULT, metric)


def test_default_run_figures_in_the_readme_match_the_committed_tables():
    import pandas as pd

    summary = default_run_medians()
    throughput = summary("throughput_rps")
    ttft = summary("ttft_p50_ms")["median"]
    cpu = summary("main_cpu_ms_per_request")["median"]
    others = summary("other_threads_cpu_percent")["median"]
    text = section(README, "## What the default run shows")
    minutes, seconds = divmod(round(runs_wall_s(DEFAULT)), 60)
    assert f"all valid, {minutes} min {seconds} s of runs;" in flat(text)
    rows = [row for row in markdown_rows(text) if len(row) == 6]
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
        value, row = claims.loc[claim, "value"], claims.loc[claim]
        assert f"- {shown} = {value:.2f}x: {verdict_words(row)} (" in text, claim
    spread = claims.loc["fixes-agree"]
    spread_text = f"{verdict_words(spread)} (spread {100 * spread['value']:.1f}%)"
    assert spread_text in text
    same = claims.loc["same-throughput-without-quota"]
    assert same["verdict"] == spread["verdict"]
    assert (
        f"so do A-free and C-free without a quota, {judged(same)} (spread "
        f"{100 * same['value']:.1f}%)" in flat(text)
    )
    cost = claims.loc["original-costs-cpu-without-quota"]
    assert f"{verdict_words(cost)} (" in text
    assert f"({cost['value']:.2f}x" in flat(text)


def test_which_fix_in_the_docs_matches_the_committed_tables():
    summary = default_run_medians()
    cpu = summary("main_cpu_ms_per_request")["median"]
    others = summary("other_threads_cpu_percent")["median"]
    text = flat(section(DOCS / "engines.md", "## What the default run shows"))
    assert f"take {others['A']:.1f}% of a core of the 0.5-core quota" in text
    assert f"leave {span(others['A-passive'], others['A-spin0'])}%" in text
    extra = 100 * (cpu["A-free"] / cpu["C-free"] - 1)
    assert (
        f"costs {extra:.0f}% more main-process CPU per request "
        f"({cpu['A-free']:.1f} against {cpu['C-free']:.1f} ms)"
    ) in text
    assert f"worker using {others['A-free']:.1f}% of a core" in text


FIXES_ON_CPU = ROOT / "docs" / "results" / "sglang-cpu-fixes"


def test_real_server_fix_figures_in_the_readme_match_the_committed_tables():
    import pandas as pd

    def medians(metric: str):
        return arm_figures(FIXES_ON_CPU, metric)["median"]

    throughput = medians("throughput_rps")
    cpu = medians("main_cpu_ms_per_request")
    others = medians("other_threads_cpu_percent")
    text = section(README, "## Every fix on the real server")
    rows = [row for row in markdown_rows(text) if len(row) == 5]
    assert {row[0] for row in rows} == set(throughput.index)
    for arm, _, rps, per_request, other in rows:
        assert rps == f"{throughput[arm]:.2f}", arm
        assert per_request == f"{cpu[arm]:.1f} ms", arm
        assert other == f"{others[arm]:.1f}%", arm
    claims = pd.read_csv(FIXES_ON_CPU / "tables" / "claims.csv")
    for claim in claims.itertuples():
        line = next(line for line in text.split("\n- ") if f"{claim.claim})" in line)
        assert f"{verdict_words(claim._asdict())} (" in line, claim.claim
        if claim.kind == "ratio":
            assert f'{claim.value:.2f}x against "{claim.bound}"' in line, claim.claim
        else:
            assert f"spread {100 * claim.value:.1f}%" in line, claim.claim


def test_the_default_results_page_matches_its_tables():
    """Every figure of docs/results/embedded-b1/README.md is in its tables."""
    import pandas as pd

    medians = {
        metric: arm_figures(DEFAULT, metric)["median"]
        for metric in (
            "throughput_rps",
            "main_cpu_ms_per_request",
            "other_threads_cpu_percent",
        )
    }
    rps, cpu, others = medians.values()
    claims = pd.read_csv(DEFAULT / "tables" / "claims.csv").set_index("claim")
    text = flat((DEFAULT / "README.md").read_text())
    assert runs_stated_on_the_page(DEFAULT, text)
    assert f"A serves {rps['A']:.1f} req/s" in text
    for arm in ("B", "C", "A-passive", "A-spin0", "D"):
        assert f"({arm} {rps[arm]:.1f})" in text or f"{arm} {rps[arm]:.1f})" in text
    recovers = claims.loc[
        [
            "thread-cap-recovers-throughput",
            "patch-recovers-throughput",
            "passive-wait-recovers-throughput",
            "no-spin-recovers-throughput",
        ]
    ]
    assert (recovers["verdict"] == "holds").all()
    low, high = recovers["value"].min(), recovers["value"].max()
    assert f"by {low:.2f}x to {high:.2f}x, and each claim holds:" in text
    for fixes, who in (
        (["thread-cap-recovers-throughput", "patch-recovers-throughput"], "the cap"),
        (["passive-wait-recovers-throughput", "no-spin-recovers-throughput"], "the"),
    ):
        (kind,) = {judged(recovers.loc[claim]) for claim in fixes}
        assert re.search(rf"for {who}[\w ]* {kind}", text), fixes
    assert f"take {others['A']:.1f}% of a core of the 0.5-core quota" in text
    assert f"they take {span(others['A-passive'], others['A-spin0'])}%" in text
    assert (
        f"the original copy serves {rps['A-free']:.1f} req/s and the patched copy "
        f"{rps['C-free']:.1f}"
    ) in text
    cost = claims.loc["original-costs-cpu-without-quota"]
    assert (
        f"costs {cpu['A-free']:.1f} ms of CPU per request against "
        f"{cpu['C-free']:.1f} ms for the patched copy ({cost['value']:.2f}x), "
        f"its worker using {others['A-free']:.1f}% of a core"
    ) in text
    assert f"asked for {cost['bound']}" in text
    assert f"and {cost['verdict']} here, {judged(cost)}:" in text
    fixed = cpu[["B", "C", "D", "A-passive", "A-spin0"]]
    assert (
        f"({fixed.min():.1f} to {fixed.max():.1f} ms, against {cpu['A']:.1f} ms in A)"
        in text
    )


def test_the_real_server_fixes_results_page_matches_its_tables():
    """Every figure of docs/results/sglang-cpu-fixes/README.md is in its tables."""
    import pandas as pd

    rps = arm_figures(FIXES_ON_CPU, "throughput_rps")["median"]
    cpu = arm_figures(FIXES_ON_CPU, "main_cpu_ms_per_request")["median"]
    others = arm_figures(FIXES_ON_CPU, "other_threads_cpu_percent")["median"]
    claims = pd.read_csv(FIXES_ON_CPU / "tables" / "claims.csv").set_index("claim")
    text = flat((FIXES_ON_CPU / "README.md").read_text())
    assert runs_stated_on_the_page(FIXES_ON_CPU, text)

    def ratio(claim: str) -> str:
        return f"{claims.loc[claim, 'value']:.2f}x"

    assert (
        f"Against A-main's {rps['A-main']:.2f} req/s, the passive policy gives "
        f"{ratio('passive-wait-recovers-main-process')}, the cap "
        f"{ratio('thread-cap-recovers-main-process')}, a zero spin count "
        f"{ratio('no-spin-recovers-main-process')} and the patch "
        f"{ratio('patch-recovers-main-process')}"
    ) in text
    for claim in (
        "passive-wait-recovers-main-process",
        "thread-cap-recovers-main-process",
        "no-spin-recovers-main-process",
        "patch-recovers-main-process",
    ):
        row = claims.loc[claim]
        assert (row["bound"], row["verdict"]) == ("at least 1.2x", "holds"), claim
        assert paired_count(row["detail"]) == "2 of 2", claim
    cost = claims.loc["original-costs-cpu-without-quota"]
    assert (
        f"spends {cpu['A-free']:.1f} ms of CPU per request against "
        f"{cpu['C-free']:.1f} ms ({cost['value']:.2f}x; the claim of "
        f"{cost['bound']} {cost['verdict']}, {judged(cost)})"
    ) in text
    assert (
        f"serves {rps['C-torch']:.2f} req/s with default threads, "
        f"{rps['C-torch-cap']:.2f} with the cap and {rps['C-torch-passive']:.2f} "
        "with the passive policy"
    ) in text
    cap, passive = (
        claims.loc["cap-keeps-torch-preprocessing"],
        claims.loc["passive-keeps-torch-preprocessing"],
    )
    assert cap["verdict"] == passive["verdict"] == "does not hold"
    assert (
        f"the fixes are {100 * cap['value']:.0f}% and {100 * passive['value']:.0f}% "
        "faster"
    ) in text
    quota = others.drop(["A-free", "C-free"])
    assert (
        f"is {quota.min():.1f}-{quota.max():.1f}% of a core under the quota "
        "in every arm" in text
    )


def test_the_gpu_host_findings_are_the_tables_figures():
    """The results page's findings, each figure from its tables, and the repeat
    against the earlier run's committed tables."""
    import pandas as pd

    def medians(metric: str):
        return arm_figures(GPU_HOST, metric)["median"]

    rps, cpu = medians("throughput_rps"), medians("main_cpu_ms_per_request")
    throttled, main = medians("throttled_share"), medians("main_cpu_percent")
    claims = gpu_host_claims()
    ratios = pd.read_csv(GPU_HOST / "tables" / "ratios.csv").set_index("claim")
    fixes = pd.read_csv(GPU_HOST / "tables" / "fixes.csv").set_index("arm")
    text = flat(section(GPU_HOST / "README.md", VERDICTS))
    halves = ratios.loc["fan-out-halves-throughput"]
    assert (
        f"(A/C {halves['ratio_of_medians']:.3f}, blocks "
        f"{halves['block_ratio_min']:.2f}-{halves['block_ratio_max']:.2f})" in text
    )
    patch, cap = (
        claims.loc["patch-recovers-throughput", "value"],
        claims.loc["thread-cap-recovers-throughput", "value"],
    )
    assert f"C/A and B/A are {patch:.2f}x and {cap:.2f}x" in text
    assert f"throttled in {100 * throttled['A']:.0f}% of periods" in text
    assert (
        f"burns {cpu['A']:.0f} ms of CPU per request against {cpu['C']:.0f} ms in C"
        in text
    )
    assert (
        f"`OMP_WAIT_POLICY=PASSIVE` ({rps['A-passive']:.1f} req/s) and "
        f"`GOMP_SPINCOUNT=0` ({rps['A-spin0']:.1f}) serve what the patch "
        f"({rps['C']:.1f}) and the thread cap ({rps['B']:.1f}) serve" in text
    )
    waiting = max(throttled["A-passive"], throttled["A-spin0"])
    assert f"so {100 * waiting:.0f}% of periods are throttled" in text
    waits = fixes.loc[["A-passive", "A-spin0"], "other_threads_cpu_percent"]
    assert "about 10% of a core" in text and (abs(waits - 10) < 1).all()
    assert (fixes.loc[["B", "C"], "other_threads_cpu_percent"] < 0.5).all()
    cost = claims.loc["original-costs-cpu-without-quota", "value"]
    assert f"uses {main['A-free']:.0f}% CPU, {cost:.1f}x the patched copy's" in text
    a = arm_figures(GPU_HOST, "throughput_rps").loc["A"]
    assert f"A ranged {a['min']:.1f}-{a['max']:.1f} req/s" in text
    others = arm_figures(GPU_HOST, "throughput_rps").drop("A")
    widest = ((others["max"] - others["min"]) / others["median"]).max()
    assert "others within about 3%" in text and widest < 0.035
    earlier = GPU_HOST / "sessions" / "2026-11-30" / "tables"
    before = pd.read_csv(earlier / "arms.csv")
    before_a = before[
        (before["arm"] == "A") & (before["metric"] == "throughput_rps")
    ].iloc[0]["median"]
    before_ratio = (
        pd.read_csv(earlier / "claims.csv")
        .set_index("claim")
        .loc["fan-out-halves-throughput", "value"]
    )
    now_ratio = claims.loc["fan-out-halves-throughput", "value"]
    assert f"gave A {before_a:.1f} and A/C {before_ratio:.2f}" in text
    assert (
        f"moved A by {100 * (before_a - rps['A']) / before_a:.1f}% and A/C by "
        f"{before_ratio - now_ratio:.3f}" in text
    )


def test_the_real_server_findings_are_the_tables_figures():
    """docs/results/sglang-cpu/README.md's prose figures, each from its tables."""

    import pandas as pd

    split = pd.read_csv(SGLANG_CPU / "tables" / "real_server.csv").set_index("arm")
    claims = pd.read_csv(SGLANG_CPU / "tables" / "claims.csv").set_index("claim")
    rps, throttled = arm_medians("throughput_rps"), arm_medians("throttled_share")
    scheduler_share = arm_medians("scheduler_cpu_percent")
    text = flat((SGLANG_CPU / "README.md").read_text())
    runs = len(list((SGLANG_CPU / "runs").glob("*/run*/provenance.json")))
    minutes, seconds = divmod(round(runs_wall_s(SGLANG_CPU)), 60)
    assert f"Its {runs} runs, each on a fresh server, took {minutes} min " in text
    assert f"{seconds} s together" in text

    def span(values, digits: int) -> str:
        return f"{values.min():.{digits}f}-{values.max():.{digits}f}"

    whole, main_only = ["A", "B", "C", "D"], ["A-main", "B-main", "C-main", "D-main"]
    starts = span(split.loc[whole, "start_to_healthy_s"], 1)
    scheduler = span(split.loc[whole, "scheduler_cpu_ms_per_request"], 0)
    assert (
        f"The whole-server arms (A-D) take {starts} s to start. Their scheduler "
        f"costs {scheduler} ms" in text
    )
    assert (
        f"at {span(split.loc[whole, 'scheduler_cpu_ms_per_request'], 0)} ms of CPU per "
        f"request, against {span(split.loc[whole, 'main_cpu_ms_per_request'], 0)} ms "
        "in the main process" in text
    )
    assert "about 95% of the 1-core quota" in text
    assert (abs(scheduler_share[whole] - 95) < 2).all()
    assert f"A {rps['A']:.2f} and C {rps['C']:.2f} req/s" in text
    assert f"(B {rps['B']:.2f}, D {rps['D']:.2f})" in text
    assert f"throttled in {span(100 * throttled[main_only], 0)}% of periods" in text
    main = split["main_cpu_ms_per_request"]
    patch = claims.loc["patch-recovers-main-process", "value"]
    assert (
        f"costs the main process {main['A-main']:.1f} ms of CPU per request against "
        f"{main['C-main']:.1f} ms for the patched copy, and C-main serves "
        f"{patch:.2f}x A-main" in text
    )
    cap = claims.loc["thread-cap-recovers-main-process", "value"]
    assert f"(B-main {cap:.2f}x)" in text
    assert (
        f"(D-main {rps['D-main']:.2f} against C-main {rps['C-main']:.2f} req/s)" in text
    )
    assert f"({span(split.loc[main_only, 'shm_copy_cpu_ms'], 1)} ms per image)" in text
    processor = split.loc[main_only, "processor_cpu_ms"]
    assert (
        f"next costs {processor['A-main']:.1f} ms, against "
        f"{span(processor.drop('A-main'), 1)} ms in the other arms" in text
    )
    rest = split.loc[main_only, "rest_cpu_ms"]
    assert f"about {span(rest, 0)} ms of HTTP" in text
    assert f"Servers take {span(split['start_to_healthy_s'], 0)} s from start" in text


@pytest.mark.parametrize(
    ("heading", "results", "shown"),
    [
        ("## On a GPU host", GPU_HOST, "{arms} arms x {runs} runs, all valid"),
        (
            "## SGLang's real server on CPU",
            SGLANG_CPU,
            "{runs} runs per arm, all {total} valid",
        ),
        (
            "## Every fix on the real server",
            FIXES_ON_CPU,
            "{arms} arms x {runs} runs, all valid",
        ),
        (
            "## What the default run shows",
            DEFAULT,
            "{arms} arms x {runs} runs, all valid",
        ),
        (
            "## SGLang's real server on a GPU host",
            GPU_HOST_REAL,
            "{arms} arms x {runs} runs, all valid",
        ),
    ],
)
def test_the_readme_counts_each_experiments_runs(heading, results, shown):
    import pandas as pd

    runs = pd.read_csv(results / "tables" / "runs.csv")
    assert runs["valid"].all()
    counts = {
        "arms": runs["arm"].nunique(),
        "runs": runs["run"].nunique(),
        "total": len(runs),
    }
    assert shown.format(**counts) in flat(section(README, heading))


def per_thread_per_request(results: Path):
    """Per arm, the median over its runs of the main thread's and the other
    threads' CPU per request: each thread group's share of a core over the run's
    throughput (percent of a core x 10 / req/s = ms per request)."""
    import pandas as pd

    runs = pd.read_csv(results / "tables" / "runs.csv")
    for column in ("main_thread", "other_threads"):
        runs[column] = runs[f"{column}_cpu_percent"] * 10 / runs["throughput_rps"]
    return runs.groupby("arm")[["main_thread", "other_threads"]].median()


def real_gpu_claims():
    import pandas as pd

    return pd.read_csv(GPU_HOST_REAL / "tables" / "claims.csv").set_index("claim")


def test_the_real_gpu_host_page_matches_its_tables():
    """docs/results/gpu-host-real/README.md: the arms, verdicts and per-thread
    tables and the findings, each figure from the page's tables."""
    import pandas as pd

    def medians(metric: str):
        return arm_figures(GPU_HOST_REAL, metric)["median"]

    page = GPU_HOST_REAL / "README.md"
    throughput = arm_figures(GPU_HOST_REAL, "throughput_rps")
    heading = "## The 2x2, cuda_ipc and the fixes that need no code change"
    rows = markdown_rows(section(page, heading))
    assert [row[0] for row in rows] == list(throughput.index)
    for arm, _, rps, ttft, main, per_request, throttled in rows:
        figures = throughput.loc[arm]
        assert rps == (
            f"{figures['median']:.1f} [{figures['min']:.1f}-{figures['max']:.1f}]"
        ), arm
        assert ttft == f"{medians('ttft_p50_ms')[arm]:.0f} ms", arm
        assert main == f"{medians('main_cpu_percent')[arm]:.0f}%", arm
        assert per_request == f"{medians('main_cpu_ms_per_request')[arm]:.1f} ms"
        assert throttled == f"{100 * medians('throttled_share')[arm]:.0f}%", arm
    claims = real_gpu_claims()
    verdicts = markdown_rows(section(page, VERDICTS))
    assert len(verdicts) == len(claims)
    for name_and_arms, bound, value, meeting, verdict, *_ in verdicts:
        claim = claims.loc[name_and_arms.split(" (")[0]]
        assert (bound, verdict) == (claim["bound"], claim["verdict"]), name_and_arms
        if claim["kind"] == "ratio":
            assert value == f"{claim['value']:.3f}x", name_and_arms
            assert meeting == paired_count(claim["detail"]), name_and_arms
        else:
            assert value == f"spread {100 * claim['value']:.1f}%", name_and_arms
    split = per_thread_per_request(GPU_HOST_REAL)
    body = section(page, "## Where the main process's CPU goes, per thread")
    rows = markdown_rows(body)
    assert [row[0] for row in rows] == list(throughput.index)
    for arm, threads, main, others, main_ms, others_ms, sched, sched_ms in rows:
        assert threads == f"{medians('torch_threads')[arm]:.0f}", arm
        assert main == f"{medians('main_thread_cpu_percent')[arm]:.1f}%", arm
        assert others == f"{medians('other_threads_cpu_percent')[arm]:.1f}%", arm
        assert main_ms == f"{split.loc[arm, 'main_thread']:.1f} ms", arm
        assert others_ms == f"{split.loc[arm, 'other_threads']:.1f} ms", arm
        assert sched == f"{medians('scheduler_cpu_percent')[arm]:.1f}%", arm
        assert sched_ms == f"{medians('scheduler_cpu_ms_per_request')[arm]:.1f} ms"
    text = flat(page.read_text())
    assert runs_wall_s(GPU_HOST_REAL) == pytest.approx(1129.1, abs=0.5)
    assert "the runs took 18 min 49 s together" in text
    rps, cpu = medians("throughput_rps"), medians("main_cpu_ms_per_request")
    runs = pd.read_csv(GPU_HOST_REAL / "tables" / "runs.csv")
    ratios = pd.read_csv(GPU_HOST_REAL / "tables" / "ratios.csv").set_index("claim")
    patch, cap, spin = (
        ratios.loc["patch-recovers-throughput"],
        ratios.loc["thread-cap-recovers-throughput"],
        ratios.loc["no-spin-recovers-throughput"],
    )
    assert (
        f"C/A is {patch['ratio_of_medians']:.2f}x and B/A "
        f"{cap['ratio_of_medians']:.2f}x (blocks {patch['block_ratio_min']:.2f}-"
        f"{patch['block_ratio_max']:.2f} and {cap['block_ratio_min']:.2f}-"
        f"{cap['block_ratio_max']:.2f}), against the study's "
        f"{patch['reference_ratio']:.2f}x and {cap['reference_ratio']:.2f}x; "
        f"A-spin0/A is {spin['ratio_of_medians']:.2f}x" in text
    )
    fixed = ["B", "C", "D", "A-passive", "A-spin0"]
    throttled = medians("throttled_share")
    assert (
        f"uses {cpu[fixed].min():.1f}-{cpu[fixed].max():.1f} ms of CPU per request "
        f"and is throttled in at most {100 * throttled[fixed].max():.0f}% of periods"
        in text
    )
    cost = claims.loc["original-costs-main-process-cpu", "value"]
    assert (
        f"burns {cpu['A']:.1f} ms of CPU per request against {cpu['C']:.1f} ms in C "
        f"({cost:.1f}x)" in text
    )
    assert f"throttled in {100 * throttled['A']:.0f}% of periods" in text
    spread = claims.loc["fixes-agree", "value"]
    assert (
        f"(spread {100 * spread:.1f}%: medians {rps[['B', 'C', 'D']].min():.1f}-"
        f"{rps[['B', 'C', 'D']].max():.1f} req/s)" in text
    )
    c_runs = runs[runs["arm"] == "C"].sort_values("throughput_rps")
    assert (
        f"(C {c_runs['throughput_rps'].min():.1f}-{c_runs['throughput_rps'].max():.1f}"
        f" req/s) while its main process stays at "
        f"{c_runs['main_cpu_ms_per_request'].min():.1f}-"
        f"{c_runs['main_cpu_ms_per_request'].max():.1f} ms per request" in text
    )
    assert (
        f"(C's slowest run {c_runs['gpu_util_percent'].iloc[0]:.0f}%, its fastest "
        f"{c_runs['gpu_util_percent'].iloc[-1]:.0f}%)" in text
    )
    assert (throttled[["B", "C", "D"]] == 0).all()
    passive = ratios.loc["passive-wait-recovers-throughput"]
    assert (
        f"(A-passive/A {passive['ratio_of_medians']:.3f}x, 0 of 3 blocks at 1.3x: "
        f"{passive['block_ratio_min']:.2f}-{passive['block_ratio_max']:.2f})" in text
    )
    assert paired_count(claims.loc["passive-wait-recovers-throughput", "detail"]) == (
        "0 of 3"
    )
    assert f"free as the other fixes' ({cpu['A-passive']:.1f} ms per request" in text
    e_over_a = claims.loc["cuda-ipc-avoids-the-copy", "value"]
    assert f"(E/A {e_over_a:.2f}x; the study: 2.95x)" in text
    assert f"lightest of all ({cpu['E']:.1f} ms per request" in text
    assert (
        f"({split.loc['A', 'main_thread']:.1f} ms per request against "
        f"{split.loc['C', 'main_thread']:.1f} ms)" in text
    )
    others = medians("other_threads_cpu_percent")
    capped = split.loc[["B", "C", "D"], "other_threads"]
    assert (
        f"take {others['A']:.1f}% of a core: {split.loc['A', 'other_threads']:.1f} ms "
        f"per request, against {capped.min():.1f}-{capped.max():.1f} ms in B, C and D"
        in text
    )
    assert (
        f"at {others['A-passive']:.1f}% and {others['A-spin0']:.1f}% of a core for "
        "their wake-ups" in text
    )
    scheduler = medians("scheduler_cpu_percent")
    per_request = medians("scheduler_cpu_ms_per_request")
    assert (
        f"whole core in every arm ({scheduler.min():.1f}-{scheduler.max():.1f}%)"
        in text
    )
    assert f"({per_request.min():.1f}-{per_request.max():.1f} ms)" in text
    assert f"uses {medians('main_cpu_percent')['E']:.0f}% of a core in all" in text
    assert (
        f"stop at {rps[fixed].min():.1f}-{rps[fixed].max():.1f} req/s, at or below"
        in text
    )


def test_the_readme_quotes_the_real_gpu_host_page():
    """The README's section and docs/gpu-hosts.md, from the page's tables and runs."""
    claims = real_gpu_claims()
    rps = arm_figures(GPU_HOST_REAL, "throughput_rps")["median"]
    cpu = arm_figures(GPU_HOST_REAL, "main_cpu_ms_per_request")["median"]
    split = per_thread_per_request(GPU_HOST_REAL)
    text = flat(section(README, "## SGLang's real server on a GPU host"))
    assert (
        f"A {rps['A']:.1f} req/s, B {rps['B']:.1f}, C {rps['C']:.1f}, D "
        f"{rps['D']:.1f}, E (cuda_ipc) {rps['E']:.1f}, A-passive "
        f"{rps['A-passive']:.1f}, A-spin0 {rps['A-spin0']:.1f}" in text
    )
    capped = split.loc[["B", "C", "D"], "other_threads"]
    assert (
        f"spends {cpu['A']:.1f} ms of CPU per request, "
        f"{split.loc['A', 'other_threads']:.1f} ms of it in torch's 16 OpenMP "
        f"workers spinning after each copy (B, C and D: {capped.min():.1f}-"
        f"{capped.max():.1f} ms)" in text
    )
    for pair in (
        ["patch-recovers-throughput", "thread-cap-recovers-throughput"],
        ["no-spin-recovers-throughput"],
        ["passive-wait-recovers-throughput", "cuda-ipc-avoids-the-copy"],
        ["original-costs-main-process-cpu"],
    ):
        rows = [claims.loc[claim] for claim in pair]
        line = next(
            line for line in text.split("- ") if f"= {rows[0]['value']:.3f}x" in line
        )
        for row in rows:
            assert f"{row['value']:.3f}x" in line
            assert f'against "{row["bound"]}": {verdict_words(row)}' in line
            assert paired_count(row["detail"]).split(" of ")[0] in line
    spread = claims.loc["fixes-agree"]
    assert f"{verdict_words(spread)} (spread {100 * spread['value']:.1f}%)" in text
    import pandas as pd

    runs = pd.read_csv(GPU_HOST_REAL / "tables" / "runs.csv")
    c_runs = runs.loc[runs["arm"] == "C", "throughput_rps"]
    assert f"(C {c_runs.min():.1f}-{c_runs.max():.1f} req/s)" in text
    pilot = GPU_HOST_REAL / "sessions" / "2026-12-03-pilot" / "tables" / "claims.csv"
    pilot_spread = pd.read_csv(pilot).set_index("claim").loc["fixes-agree", "value"]
    assert f"The pilot's B and C agreed within {100 * pilot_spread:.1f}%" in text
    docs = flat((DOCS / "gpu-hosts.md").read_text())
    valid = f"{int(runs['valid'].sum())} of {len(runs)} runs valid"
    assert f"It ran on our H200 on 2026-12-03, {valid}" in docs
    provenance = sorted(
        (
            json.loads(path.read_text())
            for path in GPU_HOST_REAL.glob("runs/*/run*/provenance.json")
        ),
        key=lambda run: run["started_at"],
    )
    first, *warm = provenance
    healthy = [run["start_to_healthy_s"] for run in warm]
    walls = [run["wall_s"] for run in provenance]
    assert (
        f"healthy in {min(healthy):.1f}-{max(healthy):.1f} s once SGLang's Triton "
        f"kernels were compiled (in {first['start_to_healthy_s']:.1f} s for the first "
        f"run, which compiled them), and a run of 160 requests took "
        f"{min(walls):.1f}-{max(walls):.1f} s in all" in docs
    )


def test_the_harness_page_quotes_the_published_harness_figures():
    """docs/harness-performance.md's table and breakdown are harness.json's, as the
    harness_benchmarks target wrote it."""
    figures = json.loads((DOCS / "results/harness/harness.json").read_text())
    text = flat(section(DOCS / "harness-performance.md", "## Measured"))
    rate = figures["client_rate"]
    phases = figures["arm"]["phases_s"]
    after_window = sum(
        phases[name] for name in ("after_measured", "teardown", "server_shutdown")
    )
    quoted = [
        f"{rate['client_max_rps']:,.0f} req/s = {rate['client_headroom_ratio']}x",
        f"| {figures['client_ttft_overhead_ms_p50']} ms |",
        f"| {figures['monitor_cpu_fraction'] * 100:.2f}% |",
        f"| {figures['arm_overhead_s']} s |",
        f"| {figures['shm_copy_patched_to_memcpy_ratio']} |",
        f"| {figures['default_study_wall_s']} s |",
        f"| {phases['launch_to_healthy']} |",
        f"| {phases['healthy_to_client_start']} |",
        f"| {phases['client_warmup']} |",
        f"| {after_window:.3f} |",
        f"client's p50 was {figures['client_ttft']['client_ttft_ms_p50']} ms",
        f"raw socket's {figures['client_ttft']['raw_socket_ttft_ms_p50']} ms",
        f"beyond its {figures['arm']['measured_seconds']:.1f} s window",
    ]
    missing = [figure for figure in quoted if figure not in text]
    assert missing == []


def test_the_real_server_arms_phases_are_its_published_runs():
    run = DOCS / "results/harness/real-server-arm/provenance.json"
    provenance = json.loads(run.read_text())
    phases = provenance["phases_s"]
    text = flat(section(DOCS / "real-server-on-cpu.md", "## Where an arm's time goes"))
    rows = [f"| {phases[name]} |" for name in phases]
    ours = sum(
        phases[name]
        for name in ("before_launch", "after_healthy", "after_window", "writing")
    )
    quoted = [
        *rows,
        f"Of the {provenance['wall_s']} s,",
        f"start and stop are {phases['server_start'] + phases['server_stop']:.1f} s",
        f"take {ours:.2f} s",
    ]
    assert [figure for figure in quoted if figure not in text] == []
    assert list(phases) == [
        "before_launch",
        "server_start",
        "after_healthy",
        "client_warmup",
        "measured_window",
        "after_window",
        "server_stop",
        "writing",
    ]


def test_the_docs_say_what_each_quoted_verdict_is():
    """docs/engines.md and real-server-on-cpu.md name the published verdicts tests or
    confirmations as their claims tables do, and quote the failed run before the
    redesign as the commit its bound_from names holds it."""

    import pandas as pd

    default = pd.read_csv(DEFAULT / "tables" / "claims.csv").set_index("claim")
    text = flat(section(DOCS / "engines.md", "## What the default run shows"))
    study = default.loc[["patch-recovers-throughput", "thread-cap-recovers-throughput"]]
    (tests,) = {each_of(row) for _, row in study.iterrows()}
    assert f"The patch's and the cap's verdicts are {tests}," in text
    piloted = default.drop(study.index).drop("fixes-agree")
    (confirmations,) = {each_of(row) for _, row in piloted.iterrows()}
    assert f"no-quota pair's are {confirmations}," in text

    fixes = pd.read_csv(FIXES_ON_CPU / "tables" / "claims.csv").set_index("claim")
    text = flat(
        section(DOCS / "real-server-on-cpu.md", "## Every fix on the real server")
    )
    torch = fixes.index.str.endswith("-keeps-torch-preprocessing")
    (recovering,) = {each_of(row) for _, row in fixes[~torch].iterrows()}
    (keeping,) = {each_of(row) for _, row in fixes[torch].iterrows()}
    assert f"The fixes' verdicts are {recovering} (" in text
    assert f"the two claims about torch preprocessing are {keeping}," in text

    claims = pd.read_csv(SGLANG_CPU / "tables" / "claims.csv").set_index("claim")
    text = flat(section(DOCS / "real-server-on-cpu.md", "## What was measured"))
    every_one = set(claims["judged_as"]) == {"confirmation"}
    assert ("Each verdict is a confirmation, not a test" in text) == every_one
    commit, failed = run_before_the_redesign(claims.loc["patch-recovers-main-process"])
    bound = failed["bound"].removeprefix("at least ")
    assert failed["verdict"] == "does not hold"
    assert (
        f"its 512 px run failed (C-main/A-main {failed['value']:.2f}x against {bound}, "
        f"committed in {commit})" in text
    )


def run_before_the_redesign(claim):
    """The commit a redesigned claim's bound_from names, and the claim's row in the
    claims table committed there: the verdict that failed before the redesign."""
    import subprocess
    from io import StringIO

    import pandas as pd

    shallow = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if shallow != "false":
        pytest.skip("the earlier run is in the checkout's git history")
    commit, path = re.search(r"committed in (\w+):(\S+)$", claim["bound_from"]).groups()
    earlier = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return commit, pd.read_csv(StringIO(earlier)).set_index("claim").loc[claim.name]


def test_the_pages_say_what_came_before_a_confirmation():
    """The run before the redesign, as committed; that the fixes' claims are
    confirmations; and the pilot behind the default page's 1.5x, as its config says."""
    import pandas as pd

    claims = pd.read_csv(SGLANG_CPU / "tables" / "claims.csv").set_index("claim")
    design_ii = claims.loc[
        ["patch-recovers-main-process", "thread-cap-recovers-main-process"]
    ]
    assert set(design_ii["judged_as"]) == {"confirmation"}
    page = flat((SGLANG_CPU / "README.md").read_text())
    assert "Both claims hold as confirmations" in page
    _, failed = run_before_the_redesign(design_ii.iloc[0])
    assert f"gave C-main/A-main {failed['value']:.2f}x against the same bound" in page
    readme = flat(section(README, "## SGLang's real server on CPU"))
    assert f"at 512 px it was {failed['value']:.2f}x)" in readme
    whole = claims.loc["whole-server-copy-is-not-the-bottleneck"]
    origin = whole["bound_from"].split(": ")[0]
    assert f"as the config's claim, set from {origin}, expected" in page

    fixes_on_cpu = pd.read_csv(FIXES_ON_CPU / "tables" / "claims.csv")
    fixes_page = flat((FIXES_ON_CPU / "README.md").read_text())
    torch = fixes_on_cpu["claim"].str.endswith("-keeps-torch-preprocessing")
    (recovering,) = set(fixes_on_cpu[~torch]["judged_as"])
    assert f"holds in both paired blocks, a {recovering}:" in fixes_page
    (keeping,) = {judged(row) for _, row in fixes_on_cpu[torch].iterrows()}
    tests_of = keeping.removeprefix("a ").replace(" of a bound", "s of a bound", 1)
    assert f"both claims do not hold, {tests_of}," in fixes_page

    fixes = gpu_host_claims().loc[
        ["passive-wait-recovers-throughput", "no-spin-recovers-throughput"]
    ]
    assert set(fixes["judged_as"]) == {"confirmation"}
    assert "Their claims hold as confirmations" in flat(
        section(GPU_HOST / "README.md", VERDICTS)
    )

    default = pd.read_csv(DEFAULT / "tables" / "claims.csv").set_index("claim")
    pilot = default.loc["original-costs-cpu-without-quota", "bound_from"]
    assert "used about 8x" in pilot and pilot.endswith("; not committed")
    assert "a pilot on the H200 (about 8x with 16 threads, not committed;" in flat(
        (DEFAULT / "README.md").read_text()
    )


def test_the_bisect_page_says_what_its_verdict_is():
    """No table of the bisect is published: the config says where the bound came
    from."""
    import yaml

    from serving_study.analysis.claims import SOURCE_WORDS, TESTED_KINDS

    (claim,) = yaml.safe_load((ROOT / "config" / "bisect.yaml").read_text())["claims"]
    kind = claim["bound_from"]["kind"]
    judged_as = "test" if kind in TESTED_KINDS else "confirmation"
    text = flat(section(DOCS / "bisect.md", "## Measured"))
    assert f"holds, 1.19x: a {judged_as} of a bound from {SOURCE_WORDS[kind]}," in text
