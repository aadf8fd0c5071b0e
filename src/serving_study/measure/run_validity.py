"""Whether a run counts: every reason it must stay out of the medians.

A run is invalid when any of its measured requests failed or it ran other than
planned (request counts, dispatch lag), when its server restarted, when the quota,
environment or code in force were not the arm's, or when other work on the host
took CPU during its window. Each reason names the numbers behind it. The arm is
the one the run recorded (its secrets redacted).
"""

import math

from serving_study.config.records import Arm
from serving_study.measure.request_log import completed, measured, values_of

# Quota readings are rounded to whole microseconds per period by the kernel.
QUOTA_TOLERANCE_CORES = 0.01
# Why a run with images that went inline does not count, and the fix.
SHM_WAS_FULL = (
    "because /dev/shm was full, so the shared-memory copy under study was skipped; "
    "give the server more /dev/shm"
)


def invalid_reasons(
    records: list[dict], monitors: dict | None, arm: Arm, checks: dict
) -> list[str]:
    """Every reason this run must stay out of the medians, with the numbers."""
    return [
        *_request_reasons(records, arm, checks),
        *server_reasons(monitors, arm, checks),
    ]


def server_reasons(monitors: dict | None, arm: Arm, checks: dict) -> list[str]:
    """Every reason but the client's own requests: the server, its quota,
    environment and code, and the host's other load (another client, such as
    bench_serving, judges its requests from its own results)."""
    return [
        *_restart_reasons(monitors, checks),
        *_quota_reasons(monitors, arm, checks),
        *_environment_reasons(arm, checks),
        *_identity_reasons(checks),
        *_host_load_reasons(monitors, checks),
    ]


def only_outside_the_arm(
    reasons: list[str], monitors: dict | None, checks: dict
) -> bool:
    """Whether the run is invalid only for the host's other load or steal, none
    of the arm's reasons (run_attempts.py then tries again, or gives back an
    earlier valid attempt)."""
    return bool(reasons) and set(reasons) <= set(_host_load_reasons(monitors, checks))


def _request_reasons(records: list[dict], arm: Arm, checks: dict) -> list[str]:
    reasons = []
    measured_records = measured(records)
    failures = [record for record in measured_records if not completed(record)]
    if failures:
        first = failures[0]
        what = first.get("error") or f"status {first.get('status')}"
        reasons.append(
            f"{len(failures)} of {len(measured_records)} measured requests did not "
            f"complete (first: request {first.get('index')}: {what})"
        )
    if len(measured_records) != arm.requests:
        reasons.append(
            f"the log holds {len(measured_records)} measured requests, "
            f"the arm asks for {arm.requests}"
        )
    expected_warmup = checks.get("warmup_requests")
    warmup_count = sum(1 for r in records if r.get("phase") == "warmup")
    if expected_warmup is not None and warmup_count != expected_warmup:
        reasons.append(
            f"warm-up requests in the log: {warmup_count}, expected "
            f"{expected_warmup}; warm-up was not excluded as planned"
        )
    lag_allowed = checks.get("max_dispatch_lag_ms_allowed")
    lags = values_of(measured_records, "dispatch_lag_ms")
    if lag_allowed is not None and lags and max(lags) > lag_allowed:
        reasons.append(
            f"dispatch lag reached {max(lags):.1f} ms, above the allowed "
            f"{lag_allowed:g} ms: the client fell behind its schedule"
        )
    return reasons


def _restart_reasons(monitors: dict | None, checks: dict) -> list[str]:
    reasons = []
    if checks.get("server_restarted"):
        reasons.append("the server restarted during the run")
    if monitors and monitors.get("server_pids_changed"):
        reasons.append("the server's process ids changed during the measured window")
    return reasons


def _quota_reasons(monitors: dict | None, arm: Arm, checks: dict) -> list[str]:
    reasons = []
    asked = arm.cpu_quota
    in_force = checks.get("quota_in_force_cores")
    if not _same_quota(asked, in_force):
        reasons.append(
            f"CPU quota in force was {_describe_quota(in_force)}, "
            f"the arm asks for {_describe_quota(asked)}"
        )
    runner_expected = checks.get("quota_expected_cores")
    if "quota_expected_cores" in checks and not _same_quota(asked, runner_expected):
        reasons.append(
            f"the runner expected a quota of {_describe_quota(runner_expected)}, "
            f"the arm asks for {_describe_quota(asked)}"
        )
    cgroup = (monitors or {}).get("cgroup") or {}
    throttled = cgroup.get("nr_throttled")
    if asked is None and throttled:
        reasons.append(
            f"the cgroup was throttled in {throttled} periods although the arm "
            "has no CPU quota: another limit applied"
        )
    return reasons


def _environment_reasons(arm: Arm, checks: dict) -> list[str]:
    reasons = []
    expected = {**(checks.get("environment_expected") or {}), **arm.environment}
    seen = checks.get("environment_seen") or {}
    for name, value in sorted(expected.items()):
        want = None if value is None else str(value)
        got = seen.get(name)
        got = None if got is None else str(got)
        if want != got:
            reasons.append(
                f"{name} was {_describe_variable(got)} in the server, "
                f"the arm asks for {_describe_variable(want)}"
            )
    omp = expected.get("OMP_NUM_THREADS")
    torch_threads = checks.get("torch_threads_seen")
    if torch_threads is not None and str(omp).isdigit() and int(omp) != torch_threads:
        reasons.append(
            f"torch used {torch_threads} intra-op threads, "
            f"OMP_NUM_THREADS={omp} asks for {omp}"
        )
    forced = arm.intra_op_threads
    if forced is not None and torch_threads is not None and forced != torch_threads:
        reasons.append(
            f"torch used {torch_threads} intra-op threads, the arm forces {forced}"
        )
    return reasons


def _identity_reasons(checks: dict) -> list[str]:
    """The server is not the one under study: another transport or mm_utils.py,
    an image that skipped shared memory, or a stand-in placeholder that ran."""
    reasons = []
    expected, seen = checks.get("transport_expected"), checks.get("transport_seen")
    if expected and seen and expected != seen:
        reasons.append(
            f"the server resolved transport {seen!r}, the arm asks {expected!r}"
        )
    expected = checks.get("mm_utils_sha256_expected")
    loaded = checks.get("mm_utils_sha256_loaded")
    if expected and loaded and expected != loaded:
        reasons.append(
            f"the server's main process loaded an mm_utils.py with sha256 "
            f"{loaded[:12]}..., the variant's is {expected[:12]}..."
        )
    if checks.get("inline_fallback_reported"):
        reasons.append(f"SGLang sent images inline {SHM_WAS_FULL}")
    for module in checks.get("patched_modules_never_loaded") or []:
        reasons.append(
            f"the variant's change is to {module.replace('.', '/')}.py, which no "
            "server process loaded: the patch does not touch the code under study"
        )
    if never_resumed := checks.get("gc_never_resumed_pids"):
        reasons.append(
            "the garbage collector paused for the server's start-up never came back "
            f"on in pid {', '.join(map(str, never_resumed))}: SGLang's post-warm-up "
            "gc freeze did not run there (is --skip-server-warmup set?)"
        )
    if placeholders := checks.get("stand_in_placeholders_called"):
        reasons.append(
            "the sgl-kernel stand-in's placeholders ran: " + ", ".join(placeholders)
        )
    return reasons


def _host_load_reasons(monitors: dict | None, checks: dict) -> list[str]:
    """Other work on the host, or other guests of its hypervisor, took CPU
    during the window (host_load.py)."""
    load = (monitors or {}).get("host_load") or {}
    reasons = []
    allowed = checks.get("max_other_load_cores_allowed")
    if allowed is not None and load and load["other_cores"] > allowed:
        reasons.append(
            f"other work on the host used {load['other_cores']:.2f} cores on "
            f"average during the measured window (the host was "
            f"{load['host_busy_cores']:.2f} cores busy, the run itself "
            f"{load['own_cores']:.2f}), above the allowed {allowed:g} "
            "(host_sharing.max_other_load_cores): the run did not have the host "
            "to itself"
        )
    allowed = checks.get("max_steal_cores_allowed")
    if allowed is not None and load.get("steal_cores", 0) > allowed:
        reasons.append(
            f"the hypervisor gave other guests {load['steal_cores']:.2f} cores of "
            f"this host's CPU time during the measured window (steal), above the "
            f"allowed {allowed:g} (host_sharing.max_steal_cores)"
        )
    return reasons


def _same_quota(first: float | None, second: float | None) -> bool:
    if first is None or second is None:
        return first is None and second is None
    return math.isclose(first, second, abs_tol=QUOTA_TOLERANCE_CORES)


def _describe_quota(cores: float | None) -> str:
    return "none" if cores is None else f"{cores:g} cores"


def _describe_variable(value: str | None) -> str:
    return "unset" if value is None else repr(value)
