"""What each figure is called and what its caption says, and which figures the
page shows (templates/figure.html.j2 draws one)."""

from collections.abc import Sequence

from serving_study.config.records import Arm

FIGURE_TITLES = {
    "throughput_vs_concurrency": "Figure 1: throughput against concurrency",
    "arm_comparison": "Figure 4: arms side by side, with the study's numbers",
    "release_series": "Releases in order: throughput and main-process CPU",
    "thread_quota_map": "Throughput over intra-op threads and CPU quota",
    "which_fix": "Which fix: throughput under the quota, by fix",
    "run_timelines": "One run per arm over time: TTFT, main-process CPU, throttling",
}

FIGURE_CAPTIONS = {
    "release_series": (
        "Per release, in release order: the median over valid runs (colored by "
        "how it compares with the release before), its [min, max] (vertical "
        "rule) and each valid run (black dots). The dashed red line marks the "
        "first release whose runs differ from the release before beyond the "
        "run-to-run spread: [min, max] ranges apart and medians at least the "
        "configured smallest change apart."
    ),
    "throughput_vs_concurrency": (
        "Median throughput over valid runs at each concurrency, one line per "
        "transport; vertical rules span the runs' [min, max], dots are single "
        "runs, dashed lines are the study's numbers."
    ),
    "arm_comparison": (
        "Per arm: the reproduction's median over valid runs (blue bar) with its "
        "[min, max] (black rule) and each valid run (black dots), beside the "
        "study's reference value (gold bar) where the study reported one."
    ),
    "which_fix": (
        "Median throughput over valid runs under the quota: the trap (the "
        "original copy with default intra-op threads) and each fix, labelled with "
        "its ratio to the trap. What each fix costs is in the table beside it."
    ),
    "run_timelines": (
        "Per arm, its representative run: the valid run whose throughput is the "
        "median of the arm's valid runs (with an even count, the one nearest the "
        "median; an arm without a valid run has none). Each cell's title names "
        "the run. Arms that differ only in their variant share a row, one column "
        "per variant, on one time axis: seconds since the measured window opened, "
        "just before the first measured request was sent. Top: each measured "
        "request's time to first token at its send time. Middle: the main "
        "process's CPU (100% is one core). Bottom: the share of the quota "
        "cgroup's CPU periods that were throttled. Both come from the monitors' "
        "10 Hz series averaged over 0.5 s bins, to keep the page small."
    ),
    "thread_quota_map": (
        "Median throughput over the map's blocks: intra-op threads of the main "
        "process (forced with torch.set_num_threads) across, the server's CPU "
        "quota down. In each block, one server per variant and thread count, "
        "side by side, its quota changed live between cells. The last panel is "
        "the second variant's throughput over the first's, the median of ratios "
        "paired within blocks (above 1: the second serves more). Invalid cells "
        "are left empty."
    ),
}


def shown_figures(specs: dict[str, dict], arms: Sequence[Arm]) -> dict[str, dict]:
    """The figures the page shows, in its order: Figure 1 only where the arms
    span several concurrencies; every figure stays a page of its own anyway."""
    shown = ["arm_comparison"]
    if len({arm.concurrency for arm in arms}) > 1:
        shown.insert(0, "throughput_vs_concurrency")
    if "release_series" in specs:
        shown.insert(0, "release_series")
    if "thread_quota_map" in specs:
        shown.append("thread_quota_map")
    if "which_fix" in specs:
        shown.append("which_fix")
    if "run_timelines" in specs:
        shown.append("run_timelines")
    return {name: specs[name] for name in shown}
