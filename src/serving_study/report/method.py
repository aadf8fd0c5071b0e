"""How the numbers were made: what a run measures, when it counts, and how the
arms' figures are summarized."""

from serving_study.analysis.summaries import BOOTSTRAP_RESAMPLES, MIN_RUNS_FOR_INTERVAL


def method_html() -> str:
    return (
        "<p>Each run sends its warm-up requests first and measures only the "
        "requests after them. Throughput is the number of measured requests that "
        "completed, divided by the time from the first measured send to the last "
        "measured completion. Latency percentiles interpolate linearly between "
        "completed requests. CPU figures come from samplers outside the server's "
        "cgroup: per-process CPU from process times, cores used and throttled "
        "periods from the cgroup's own counters.</p>"
        "<p>A run counts only if every measured request completed without error, "
        "the server kept its processes, the CPU quota and environment seen in the "
        "server match the arm, the warm-up count matches, and the client kept to "
        "its send schedule. Arm figures are medians over the runs that count, "
        "shown with their [min, max]. A bootstrap 95% interval of the median "
        f"({BOOTSTRAP_RESAMPLES:,} resamples) is given only from "
        f"{MIN_RUNS_FOR_INTERVAL} valid runs on: with fewer, resampled medians "
        "can only repeat the observed values. Ratios are ratios of medians; where "
        "both arms have a valid run in the same repetition block, the ratio within "
        "each block is listed too.</p>"
    )
