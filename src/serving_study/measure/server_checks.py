"""What a run's server is and did, checked: the facts a run's validity rests on.

``server_identity`` asks the running server what it is: the transport it
resolved, the ``mm_utils.py`` its main process loaded, its intra-op threads, and
for real SGLang what its log says (``server_log_facts``). ``validity_checks``
adds the quota in force, the environment seen in the server, restarts and the
client's limits. ``run_validity`` turns the result into a run's reasons.
"""

import os

import psutil

from serving_study.config.platform import STARTUP_GC_PAUSE_VARIABLE
from serving_study.config.records import ClientSettings, HostSharing
from serving_study.config.secrets import redacted_check
from serving_study.launch.plan import LaunchPlan
from serving_study.measure.server_log_facts import (
    gc_never_resumed,
    inline_fallback_reported,
    loaded_modules,
    main_process_load,
    reported_values,
    stand_in_calls,
)
from serving_study.servers.container_runtime import ContainerServer
from serving_study.servers.local_runtime import LocalServer


def environment_seen(pid: int, names) -> dict:
    """The values of ``names`` in the running server's own environment (/proc)."""
    try:
        environment = psutil.Process(pid).environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return {name: None for name in names}
    return {name: environment.get(name) for name in names}


def validity_checks(
    plan: LaunchPlan,
    client: ClientSettings,
    server_info: dict,
    window: dict,
    server: LocalServer | ContainerServer,
    identity: dict,
    sharing: HostSharing | None = None,
) -> dict:
    """The facts the run's validity rests on, the running server against its
    plan; ``sharing`` bounds the host's other load and steal during the window
    (None: not checked)."""
    quota = server.group.quota_in_force() if server.group else {}
    # The arm's secrets are expected with the runner's values (what it passed on).
    secrets = plan.secret_environment
    expected = {
        name: plan.environment[name] for name in plan.expected.checked_environment
    }
    expected |= {name: os.environ.get(name) for name in secrets}
    reported = identity.pop("environment_reported", None)
    seen = environment_seen(server.pid, expected)
    if reported is not None:
        seen |= reported_values(reported, expected)
    expected_record, seen_record = redacted_check(expected, seen, secrets)
    return {
        "quota_expected_cores": plan.quota.cores,
        "quota_in_force_cores": quota.get("cores"),
        "environment_expected": expected_record,
        "environment_seen": seen_record,
        "server_restarted": bool(window.get("server_pids_changed")),
        "max_dispatch_lag_ms_allowed": client.max_dispatch_lag_ms,
        "warmup_requests": client.warmup_requests,
        "max_other_load_cores_allowed": sharing and sharing.max_other_load_cores,
        "max_steal_cores_allowed": sharing and sharing.max_steal_cores,
        **identity,
    }


def server_identity(
    plan: LaunchPlan, server_info: dict, server: LocalServer | ContainerServer
) -> dict:
    """What the running server says it is, on ``/server_info`` (the embedded
    engine) or in its log (real SGLang, which also says whether an image went
    inline or a stand-in placeholder ran). A check this engine cannot make is
    listed under ``not_checked``, never passed silently."""
    facts = {
        "transport_expected": plan.expected.transport,
        "mm_utils_sha256_expected": plan.expected.mm_utils_sha256,
        "not_checked": [],
    }
    if plan.expected.reported_in == "server_info":
        return facts | {
            "transport_seen": server_info.get("transport"),
            "mm_utils_sha256_loaded": server_info.get("mm_utils_sha256"),
            "torch_threads_seen": server_info.get("torch_num_threads"),
        }
    log_text = server.log_path.read_text(errors="replace")
    main_pid = server.pid if isinstance(server, LocalServer) else None
    load = main_process_load(log_text, main_pid)
    calls = stand_in_calls(log_text)
    loads = loaded_modules(log_text)
    reported = {report.module for report in loads}
    facts |= {
        "patched_modules_never_loaded": [
            module for module in plan.expected.patched_modules if module not in reported
        ],
        "transport_seen": server_info.get("mm_feature_transport"),
        "mm_utils_loaded_from": load.file if load else None,
        "mm_utils_sha256_loaded": load.sha256 if load else None,
        "torch_threads_seen": load.torch_threads if load else None,
        # The main process's own view of its thread knobs (see the probe).
        "environment_reported": load.environment if load else None,
        "inline_fallback_reported": inline_fallback_reported(log_text),
        "stand_in_placeholders_called": sorted(
            {call.op for call in calls if call.placeholder}
        ),
        "stand_in_ops_called": sorted(
            {f"{call.op} ({call.title})" for call in calls if not call.placeholder}
        ),
    }
    if server.environment.get(STARTUP_GC_PAUSE_VARIABLE) == "1":
        facts["gc_never_resumed_pids"] = gc_never_resumed(log_text, loads)
    if load is None:
        facts["not_checked"].append(
            "mm_utils.py loaded and intra-op threads: the server's main process "
            "printed no load report (no load probe on its path)"
        )
    return facts
