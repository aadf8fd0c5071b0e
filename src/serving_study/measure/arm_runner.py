"""One (arm, run): a fresh server, warm-up, the measured window, teardown, metrics.

The order matters and is the method: the server starts in its own cgroup with the
arm's quota and environment; the runner waits for /health, reads back what the
server really runs with (/server_info), sends the warm-up at the arm's concurrency,
and only then opens the monitors' window around the measured requests. Teardown
runs in ``finally`` whatever happened. A run whose server never became healthy or
died is written as a failed run (all outputs present, ``valid: false`` with the
reason) so the study goes on and the report lists it; nothing of it is averaged in.
"""

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from serving_study.config.platform import (
    PROJECT_ROOT,
    SGLangPlatform,
    compile_cache,
    platform_for,
    python_path,
)
from serving_study.config.secrets import require_secrets, secret_names
from serving_study.measure.client import (
    ServerNeverHealthy,
    load_requests,
    local_session,
    run_load,
    wait_until_healthy,
)
from serving_study.measure.host_load import HostLoadMeter
from serving_study.measure.host_sharing import HostSharing, MeasurementLock
from serving_study.measure.monitors import RunMonitors
from serving_study.measure.run_metrics import failed_run_metrics, summarize_run
from serving_study.measure.server_checks import server_identity, validity_checks
from serving_study.measure.server_log_facts import REPORT_MODULES_VARIABLE
from serving_study.servers.commands import embedded_server_argv
from serving_study.servers.container_runtime import (
    ContainerServer,
    container_options,
    read_image_id,
)
from serving_study.servers.environment import (
    recorded_environment,
    redacted,
    server_environment,
)
from serving_study.servers.leftovers import owned_name, reap_leftovers
from serving_study.servers.local_runtime import LocalServer, free_port
from serving_study.servers.sglang_commands import (
    model_mount,
    served_model_name,
    sglang_server_argv,
    sglang_server_environment,
)
from serving_study.sources.images import EMBEDDED_PYTHON, EMBEDDED_VARIANT_ROOT
from serving_study.sources.variants import changed_modules

log = logging.getLogger(__name__)

PORT_ATTEMPTS = 3


@dataclass(frozen=True)
class RunPaths:
    metrics: Path
    requests: Path
    monitors: Path
    provenance: Path
    server_log: Path

    @classmethod
    def in_directory(cls, directory: Path) -> "RunPaths":
        """The usual file names of one run inside ``directory``."""
        return cls(
            metrics=directory / "metrics.json",
            requests=directory / "requests.jsonl",
            monitors=directory / "monitors.json",
            provenance=directory / "provenance.json",
            server_log=directory / "server.log",
        )


class ArmFailed(RuntimeError):
    """The run could not be measured; the message is recorded as its reason."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def quota_cores(arm: dict) -> float | None:
    return None if arm["cpu_quota"] == "none" else float(arm["cpu_quota"])


def in_container(engine: dict) -> bool:
    return engine["runtime"] != "local"


def server_argv(engine: dict, variant: dict, arm: dict, port: int) -> list[str]:
    """The command that starts the arm's server: the embedded engine with the
    variant's source, or ``sglang.launch_server`` with the model (in the variant's
    image, or with this host's SGLang when ``runtime: local``)."""
    if engine["engine"] == "sglang":
        return sglang_server_argv(
            arm,
            engine["sglang"],
            sglang_model_path(engine),
            port,
            sglang_platform(engine),
            model_flags=tuple(engine.get("model_flags", ())),
            python=sglang_python(engine),
        )
    argv = embedded_server_argv(
        sglang_python_root=(
            EMBEDDED_VARIANT_ROOT
            if in_container(engine)
            else variant["sglang_python_root"]
        ),
        port=port,
        transport=arm["transport"],
        settings=engine["embedded"],
        intra_op_threads=arm.get("intra_op_threads"),
    )
    if in_container(engine):
        argv[0] = EMBEDDED_PYTHON  # the image's interpreter, not this host's
    return argv


def sglang_platform(engine: dict) -> SGLangPlatform:
    return platform_for(engine["sglang_device"])


def shared_compile_cache(engine: dict) -> tuple[str, str]:
    """torch inductor's cache that every arm's server shares, created if new:
    (host directory, path inside the server)."""
    directory, seen_as = compile_cache(sglang_platform(engine), in_container(engine))
    directory.mkdir(parents=True, exist_ok=True)
    return str(directory), seen_as


def sglang_python(engine: dict) -> str:
    """The interpreter that runs SGLang: the image's, the runtime the workflow
    built (CPU hosts), or this host's own."""
    if in_container(engine):
        return "python3"
    if sglang_platform(engine).builds_runtime:
        return engine["runtime_python"]
    return sys.executable


def sglang_model_path(engine: dict) -> str:
    """The model as the SGLang server sees it (mounted inside a container)."""
    host_path = engine["model_host_path"]
    if not in_container(engine):
        return host_path
    return model_mount(engine["sglang"]["model"], host_path)[2]


def arm_environment(
    engine: dict, arm: dict, variant: dict | None = None
) -> dict[str, str]:
    """What the arm's config sets in the server's environment (and, for SGLang,
    the cache settings SGLang only reads from the environment, and on this host
    the variant's tree first on the path; an image has its own)."""
    if engine["engine"] != "sglang":
        return dict(arm.get("environment", {}))
    platform = sglang_platform(engine)
    environment = sglang_server_environment(
        arm, engine["sglang"], platform, in_container(engine)
    )
    if variant is not None:
        # The load probe reports these too: a patch the server never loads shows.
        environment[REPORT_MODULES_VARIABLE] = ",".join(
            changed_modules(variant, PROJECT_ROOT)
        )
    if not in_container(engine) and variant is not None:
        environment["PYTHONPATH"] = python_path(platform, variant["sglang_python_root"])
    return environment


def model_name(engine: dict) -> str:
    """The ``model`` the client sends."""
    if engine["engine"] == "sglang":
        return served_model_name(engine["sglang"])
    return engine["embedded"]["served_model_name"]


def new_server(
    engine: dict,
    argv: list[str],
    arm: dict,
    name: str,
    paths: RunPaths,
    client: dict,
    workload_manifest: Path | None,
    variant: dict | None = None,
) -> LocalServer | ContainerServer:
    """The server of one attempt: on this host, or in a container of its image.

    A container gets the arm's environment and nothing of the host's.
    """
    if not in_container(engine):
        if engine["engine"] == "sglang":
            shared_compile_cache(engine)
        return LocalServer(
            argv,
            server_environment(os.environ, arm_environment(engine, arm, variant)),
            quota_cores(arm),
            name,
            paths.server_log,
            quota_during_startup=client["quota_during_startup"],
            quota_scope=arm.get("quota_scope", "server"),
            terminate_leader_only=engine["engine"] == "sglang",
        )
    mounts, writable_mounts = [], []
    if engine["engine"] == "sglang":
        source, mounted_at, _ = model_mount(
            engine["sglang"]["model"], engine["model_host_path"]
        )
        mounts.append((source, mounted_at))
        writable_mounts.append(shared_compile_cache(engine))
    return ContainerServer(
        argv,
        arm_environment(engine, arm),
        quota_cores(arm),
        name,
        paths.server_log,
        quota_during_startup=client["quota_during_startup"],
        image=read_image_id(engine["image_id_file"]),
        runtime=engine["runtime"],
        read_only_mounts=mounts,
        writable_mounts=writable_mounts,
        passed_environment=secret_names(arm),
        **container_options(
            engine["container"],
            sglang_platform(engine) if engine["engine"] == "sglang" else None,
            arm["concurrency"],
            workload_manifest,
        ),
    )


def start_healthy_server(
    engine: dict,
    variant: dict,
    arm: dict,
    group_name: str,
    paths: RunPaths,
    client: dict,
    workload_manifest: Path | None = None,
) -> tuple[LocalServer | ContainerServer, str]:
    """Start the server on a free port and wait for /health; retry a lost port race."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port()
        server = new_server(
            engine,
            server_argv(engine, variant, arm, port),
            arm,
            f"{group_name}-try{attempt}",
            paths,
            client,
            workload_manifest,
            variant,
        )
        base_url = f"http://127.0.0.1:{port}"
        try:
            server.start()
            wait_until_healthy(
                base_url, client["health_timeout_s"], process=server.process
            )
            server.settle_after_start()
            if not client["quota_during_startup"]:
                server.apply_quota()
            return server, base_url
        except ServerNeverHealthy as error:
            tail = server.log_tail()
            server.stop()
            if "address already in use" in tail.lower() and attempt < PORT_ATTEMPTS:
                log.warning(
                    "port %d was taken before the server bound it; retrying", port
                )
                continue
            raise ArmFailed(f"server never healthy: {error}\n{tail}") from error
        except BaseException:
            # Interrupted while starting (e.g. SIGTERM): the caller never gets
            # this server, so it must not outlive this function.
            server.stop()
            raise
    raise ArmFailed("no free port after several attempts")


def read_server_info(base_url: str) -> dict:
    with local_session() as session:
        with session.get(f"{base_url}/server_info", timeout=30) as response:
            response.raise_for_status()
            return response.json()


def measure(
    base_url: str,
    server: LocalServer,
    arm: dict,
    engine: dict,
    workload_manifest: Path,
    client: dict,
    monitors: dict,
    paths: RunPaths,
) -> tuple[dict, dict]:
    """Warm-up, then the measured requests inside the monitors' window.

    Warm-up and measured requests form one closed loop at the arm's concurrency:
    the window opens as the first measured request is sent, with the pipeline
    already full, and closes when the last measured request ends.
    """
    chat_requests = load_requests(workload_manifest)
    server.remember_tree()
    # The run's own CPU: every group of its server (the model processes' too).
    own_groups = (server.group, getattr(server, "model_group", None))
    run_monitors = RunMonitors(
        server.pid,
        server.group,
        sample_hz=monitors["sample_hz"],
        thread_sample_hz=monitors["thread_sample_hz"],
        gpu={"auto": None, "on": True, "off": False}[monitors["gpu"]],
        host_load=HostLoadMeter([group for group in own_groups if group]),
    )
    window: dict = {}
    try:
        # Find the server's processes now, so that opening the window on the
        # client's event loop only reads counters.
        run_monitors.discover()
        log.info(
            "%d warm-up then %d measured requests at concurrency %d",
            client["warmup_requests"],
            arm["requests"],
            arm["concurrency"],
        )
        summary = asyncio.run(
            run_load(
                base_url,
                chat_requests,
                concurrency=arm["concurrency"],
                measured_requests=arm["requests"],
                warmup_requests=client["warmup_requests"],
                output_tokens=arm["output_tokens"],
                model=model_name(engine),
                out_path=paths.requests,
                progress=True,
                request_timeout_s=client["request_timeout_s"],
                on_measured_start=run_monitors.start_window,
                on_measured_end=lambda: window.update(run_monitors.stop_window()),
            )
        )
    finally:
        run_monitors.stop()
    if not window:
        raise ArmFailed("the measured window never closed (the client stopped early)")
    return window, summary.to_dict()


@contextlib.contextmanager
def termination_as_interrupt():
    """Turn SIGTERM into KeyboardInterrupt while a run is in progress.

    Snakemake stops running jobs with SIGTERM when it is interrupted; Python's
    default would end the process at once, skipping every ``finally`` and leaving
    the server, its cgroup and its segments behind. As an exception, the teardown
    runs and the job ends without writing outputs, so a rerun (with
    --rerun-incomplete) measures the run afresh.
    """

    def interrupt(signal_number, frame):
        raise KeyboardInterrupt(f"stopped by signal {signal_number}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


@termination_as_interrupt()
def run_arm(
    *,
    experiment: str,
    arm: dict,
    run: int,
    variant: dict,
    workload_manifest: Path,
    engine: dict,
    client: dict,
    monitors: dict,
    paths: RunPaths,
    sharing: HostSharing | None = None,
    traced_to: dict | None = None,
) -> dict:
    """Run one (arm, run) and write all its outputs; return its metrics.

    ``traced_to`` goes into the run's provenance as it is: the project's commit,
    the config's hash, the host and the versions (run_provenance.py).

    The run holds the host's measurement lock (``sharing``: the config's
    ``host_sharing``, the schema's defaults when None) from before its server
    starts until it is torn down, and first removes what dead runs left. A busy
    host (lock ``fail``, or waited too long) raises HostBusy: no output, so a
    rerun measures it. Any other error fails this run only: it is recorded.
    """
    sharing = sharing or HostSharing.from_config({})
    # A secret the arm names but the runner lacks is a setup error: nothing starts.
    require_secrets(arm, os.environ)
    paths.server_log.write_text("")
    group_name = owned_name(f"{experiment}-{arm['name']}-run{run}")
    # What is recorded of the arm: secret values (tokens) never reach a file.
    arm_record = arm | {"environment": redacted(arm.get("environment", {}))}
    lock = MeasurementLock.acquire(
        sharing, holder=f"experiment {experiment}, arm {arm['name']}, run {run}"
    )
    # The run's time starts once it has the host (the wait is in host_lock).
    started_at, started = now_iso(), time.monotonic()
    provenance = {
        "experiment": experiment,
        "arm": arm_record,
        "run": run,
        "variant": variant,
        "engine": engine,
        "started_at": started_at,
        "host_lock": lock.record,
        **(traced_to or {}),
    }
    server = None
    inline_images = 0
    try:
        container_runtimes = (engine["runtime"],) if in_container(engine) else ()
        provenance["leftovers_reaped"] = reap_leftovers(container_runtimes).to_dict()
        server, base_url = start_healthy_server(
            engine, variant, arm, group_name, paths, client, workload_manifest
        )
        provenance["start_to_healthy_s"] = round(time.monotonic() - started, 3)
        server_info = read_server_info(base_url)
        provenance.update(
            server_argv=server.argv,
            environment_in_force=recorded_environment(
                server.environment, secret_names(arm)
            ),
            server_info=server_info,
            quota_in_force=server.group.quota_in_force(),
        )
        if isinstance(server, LocalServer):
            provenance["quota_scope"] = {
                "scope": server.quota_scope,
                "model_processes_moved": server.moved_model_pids,
                "model_group": server.model_group.quota_in_force()
                if server.model_group
                else None,
            }
        if isinstance(server, ContainerServer):
            provenance.update(
                container_argv=server.run_argv,
                image=server.image,
                image_run=server.image_run,
                quota_seen_inside=server.quota_seen_inside(),
            )
        window, load_summary = measure(
            base_url, server, arm, engine, workload_manifest, client, monitors, paths
        )
        if server.exit_code() is not None:
            raise ArmFailed(
                f"server exited with code {server.exit_code()} during the run\n"
                f"{server.log_tail()}"
            )
        identity = server_identity(engine, arm, variant, server_info, server)
        checks = validity_checks(
            arm,
            client,
            server_info,
            window,
            server,
            identity,
            max_other_load_cores=sharing.max_other_load_cores,
        )
        # Afterwards too: its request-path stage totals say where the main process
        # spent its time during the run.
        server_info_after = read_server_info(base_url)
        provenance["server_info_after_run"] = server_info_after
        inline_images = server_info_after.get("inline_fallbacks", 0) - (
            server_info.get("inline_fallbacks", 0)
        )
        provenance["client"] = load_summary
        write_json(paths.monitors, window)
        metrics = summarize_run(paths.requests, paths.monitors, arm_record, checks)
    except Exception as failure:
        # ArmFailed says why; anything else is a fault of this run alone, and the
        # study goes on (an interrupt is not an Exception: it ends the job).
        reason = str(failure)
        if not isinstance(failure, ArmFailed):
            reason = f"unexpected {type(failure).__name__}: {failure}"
            provenance["traceback"] = traceback.format_exc()
        log.error("run failed: %s", reason)
        metrics = failed_run_metrics(arm_record, run, (reason or "?").splitlines()[0])
        provenance["failure"] = reason
        for path in (paths.requests, paths.monitors):
            if not path.exists():
                path.write_text("" if path.suffix == ".jsonl" else "null\n")
    finally:
        try:
            if server is not None:
                server.stop()
                provenance["leaked_segments_removed"] = server.leaked_segments
        finally:
            lock.release()
    metrics.update(experiment=experiment, arm=arm["name"], run=run)
    if metrics.get("valid") and inline_images:
        metrics["valid"] = False
        metrics.setdefault("invalid_reasons", []).append(
            f"{inline_images} images went inline because /dev/shm was full, so the "
            "shared-memory copy under study was skipped; give the server more /dev/shm"
        )
    if server is not None and server.leaked_segments and metrics.get("valid"):
        metrics["valid"] = False
        metrics.setdefault("invalid_reasons", []).append(
            f"the server left {len(server.leaked_segments)} shared-memory segments"
        )
    provenance.update(
        finished_at=now_iso(), wall_s=round(time.monotonic() - started, 3)
    )
    write_json(paths.provenance, provenance)
    write_json(paths.metrics, metrics)
    log.info(
        "run %s/%s: valid=%s throughput=%s req/s",
        arm["name"],
        run,
        metrics.get("valid"),
        metrics.get("throughput_rps"),
    )
    return metrics
