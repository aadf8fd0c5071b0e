"""The setup section: the host, when the runs were measured, each arm's
settings, the variants and where their engine source came from, and for real
SGLang on a CPU host or with a GPU host's own torch what differs."""

from datetime import UTC, datetime

import pandas as pd

from serving_study.analysis.summaries import describe_environment
from serving_study.report.formatting import describe
from serving_study.report.markup import Table, render
from serving_study.report.settings import ReportSettings
from serving_study.servers.container_commands import CONFINED, LEAST_PRIVILEGE


def setup_tables(
    tables: dict[str, pd.DataFrame], settings: ReportSettings, host: dict
) -> list[Table]:
    """The host and when the runs were measured, then each arm's settings."""
    runs = tables["runs"]
    host_rows = host_summary_rows(host) + [["runs measured", run_dates(runs)]]
    host_rows.append(["what served the requests", settings.model])
    if settings.reference_source:
        host_rows.append(["study numbers from", describe(settings.reference_source)])
    if settings.container is not None:
        host_rows.append(["each server's container", container_allowance(settings)])
    arm_rows = []
    for arm in settings.arms:
        arm_runs = runs[runs["arm"] == arm.name]
        threads = sorted({int(t) for t in arm_runs["torch_threads"].dropna()})
        valid = int(arm_runs["valid"].astype(bool).sum())
        arm_rows.append(
            {
                "arm": arm.name,
                "variant": describe(arm.variant),
                "workload": describe(arm.workload),
                "transport": describe(arm.transport),
                "load": arm.load,
                "CPU quota (cores)": describe(arm.cpu_quota),
                "environment": describe_environment(arm.environment),
                "intra-op threads seen": ", ".join(map(str, threads)) or "not recorded",
                "valid runs": f"{valid} of {len(arm_runs)}",
            }
        )
    return [Table(["setting", "value"], host_rows), Table.of_rows(arm_rows)]


def container_allowance(settings: ReportSettings) -> str:
    """What a server's container was allowed (its launch plan holds the rest)."""
    container = settings.container
    shm = container.get("shm_size") or "sized for the workload's load"
    if container.get("ipc_host"):
        shm = "the host's (--ipc=host)"
    options = " ".join((*LEAST_PRIVILEGE, *CONFINED))
    return (
        f"{settings.runtime} run --network=host {options}, the arm's quota as "
        f"--cpus; /dev/shm {shm}; GPUs {container.get('gpus')}"
    )


def variants_table(variants: list[dict]) -> Table:
    rows = []
    for variant in variants:
        patch = variant.get("patch") or variant.get("pull_request") or {}
        rows.append(
            [
                describe(variant.get("name")),
                source_text(variant.get("source") or {}),
                describe(patch.get("file")) if patch else "none (unpatched)",
                describe(patch.get("sha256")) if patch else "",
                describe(variant.get("mm_utils_sha256")),
            ]
        )
    header = ["variant", "source", "patch", "patch sha256", "mm_utils.py sha256"]
    return Table(header, rows)


def source_text(source: dict) -> str:
    """One line naming where a variant's engine source came from, with its hash."""
    kind = source.get("kind")
    if kind == "pypi":
        return (
            f"PyPI {source.get('package')} {source.get('version')} "
            f"({source.get('file')}, sha256 {source.get('sha256')})"
        )
    if kind == "git":
        return f"git {source.get('url')} at {source.get('commit')}"
    if kind == "path":
        return f"local copy {source.get('path')} (sha256 {source.get('sha256')})"
    return describe(source)


def host_summary_rows(host: dict) -> list[list[str]]:
    """The host description (results/<experiment>/host.json) as readable rows."""
    if not host:
        return [["host", "not recorded"]]
    gpu = host.get("gpu") or {}
    gpus = gpu.get("gpus") or []
    gpu_text = (
        "; ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in gpus)
        + f", driver {gpu.get('driver')}"
        if gpus
        else f"none ({gpu.get('reason') or 'not recorded'})"
    )
    runtimes = []
    for name, runtime in sorted((host.get("container_runtimes") or {}).items()):
        if not runtime.get("installed"):
            runtimes.append(f"{name}: not installed")
        else:
            state = "running" if runtime.get("engine_reachable") else "not running"
            runtimes.append(f"{runtime.get('version')} (engine {state})")
    versions = host.get("versions") or {}

    def value(key: str) -> str:
        return describe(host.get(key))

    return [
        ["host", value("hostname")],
        [
            "CPU",
            f"{value('cpu_model')}: {value('visible_cpus')} visible of "
            f"{value('cpu_count')}",
        ],
        ["memory", f"{value('memory_gib')} GiB"],
        ["kernel, cgroup", f"{value('kernel')}, cgroup {value('cgroup_version')}"],
        ["GPU", gpu_text],
        ["engine, runtime", f"{value('engine')}, {value('runtime')}"],
        ["container runtimes", "; ".join(runtimes) or "not recorded"],
        ["free /dev/shm", f"{value('shared_memory_free_mib')} MiB"],
        [
            "software",
            ", ".join(f"{name} {version}" for name, version in versions.items()),
        ],
    ]


def run_dates(runs: pd.DataFrame) -> str:
    starts = runs["window_start_epoch"].dropna()
    ends = runs["window_end_epoch"].dropna()
    if starts.empty:
        return "no run recorded its measurement window"
    first = datetime.fromtimestamp(float(starts.min()), tz=UTC)
    last = datetime.fromtimestamp(
        float(ends.max() if not ends.empty else starts.max()), tz=UTC
    )
    return f"{first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC"


def platform_html(settings: ReportSettings) -> str:
    """For real SGLang on a platform that differs from the study's (a CPU host, a
    GPU host's own torch): what differs, and which arms have the quota on the main
    process alone; nothing elsewhere."""
    platform = settings.platform
    if platform is None or not platform.differences:
        return ""
    main_only = [arm.name for arm in settings.arms if arm.quota_scope == "main_process"]
    return render(
        "platform.html.j2",
        heading=platform.differences_heading,
        differences=platform.differences,
        main_only=main_only,
    )
