"""How one server starts, as one value: built once, run as it is, written as it ran.

A ``LaunchPlan`` holds everything that decides a server's start: its argv, the
environment it sets (secrets only by name: the runner passes their values, which no
record holds), the host variables a local server keeps, its working directory, the
CPU quota with its scope and when it comes in force, how it is stopped, its
container options when it runs in one, and what the running server must report
back. An engine's adapter builds it (``launch.engines``); the local and container
runtimes run it and add only what is per run: the port, and the cgroup's and
container's names. ``record`` is what ``commands/<arm>.json`` and every run's
provenance hold; ``from_record`` reads it back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from serving_study.config.secrets import REDACTED, is_secret, redacted

# What a run adds to its plan: a free port (in argv too) and the names of its
# cgroup and container. Two records of one plan differ in nothing else.
PER_RUN_FIELDS = ("port",)
PORT_FLAG = "--port"
# What a quota binds, and when it comes in force (the schema's arms[] enums).
QUOTA_SCOPES = ("server", "main_process")
QUOTA_TIMINGS = ("healthy", "start")
# What a local server keeps of the runner's environment (patterns), besides the
# plan's own variables and the secrets it names: what finding programs, libraries,
# GPUs and caches takes. No thread knob (an arm's threads are what it measures)
# and no secret-looking name is ever kept.
HOST_VARIABLES = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_*",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "CUDA_*",
    "NVIDIA_*",
    "HF_HOME",
    "HF_HUB_CACHE",
    "XDG_CACHE_HOME",
    "TRITON_CACHE_DIR",
)


@dataclass(frozen=True)
class Quota:
    """The arm's CPU quota: ``cores`` (None: no quota), what it binds (``scope``:
    the whole server, or its main process alone) and when it comes in force
    (``timing``: at the start, or once the server is healthy)."""

    cores: float | None
    scope: str
    timing: str

    @property
    def from_start(self) -> bool:
        return self.timing == "start"

    @property
    def main_process_only(self) -> bool:
        return self.scope == "main_process"


@dataclass(frozen=True)
class ContainerOptions:
    """How the runtime runs the server's image: ``image`` is the variant image's
    tag (the run checks that it names the image the build wrote), ``shm_size`` a
    private /dev/shm or None with ``ipc_host`` (the host's), ``gpus`` a GPU request
    or None, mounts as (host path, container path) pairs."""

    runtime: str
    image: str
    shm_size: str | None
    ipc_host: bool
    gpus: str | None
    read_only_mounts: tuple[tuple[str, str], ...]
    writable_mounts: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Expected:
    """What the running server must report back for its run to count: the
    transport it resolved, the ``mm_utils.py`` it loaded, the modules the variant
    changed (each must show as loaded), and the arm's own variables as the
    server's processes see them."""

    transport: str
    mm_utils_sha256: str
    patched_modules: tuple[str, ...]
    checked_environment: tuple[str, ...]
    # Where the server reports what it loaded: its /server_info answer, or (real
    # SGLang, through the load probe) its log.
    reported_in: str


@dataclass(frozen=True)
class EngineCommand:
    """What an engine's adapter decides of a start: the argv (without the port),
    the environment it sets, how the server is stopped, the model name clients
    send, where it reports what it loaded, what a container must mount, and the
    modules the variant changed."""

    argv: tuple[str, ...]
    environment: Mapping[str, str]
    stop_signal: str
    stop_leader_only: bool
    served_model_name: str
    reported_in: str
    read_only_mounts: tuple[tuple[str, str], ...] = ()
    writable_mounts: tuple[tuple[str, str], ...] = ()
    patched_modules: tuple[str, ...] = ()
    wants_gpus: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    engine: str
    argv: tuple[str, ...]
    port: int | None
    environment: Mapping[str, str]
    secret_environment: tuple[str, ...]
    host_environment: tuple[str, ...]
    working_directory: str | None
    quota: Quota
    stop_signal: str
    stop_leader_only: bool
    served_model_name: str
    expected: Expected
    container: ContainerOptions | None = None

    @property
    def in_container(self) -> bool:
        return self.container is not None

    def environment_from(self, runner: Mapping[str, str]) -> dict[str, str]:
        """The server's whole environment, given the runner's: the host variables
        the plan keeps (never a secret-looking one), the plan's own, then the
        secrets it passes by name."""
        kept = {
            name: value
            for name, value in runner.items()
            if any(fnmatchcase(name, pattern) for pattern in self.host_environment)
            and not is_secret(name)
        }
        secrets = {
            name: runner[name] for name in self.secret_environment if name in runner
        }
        return kept | dict(self.environment) | secrets

    def command(self) -> list[str]:
        """The argv as started, the port last (no config value can set it)."""
        if self.port is None:
            return list(self.argv)
        return [*self.argv, PORT_FLAG, str(self.port)]

    def for_run(self, port: int) -> LaunchPlan:
        return dataclasses.replace(self, port=port)

    def record(self) -> dict:
        """The plan as JSON values, with the command as started; a value under a
        secret-looking name is redacted (the config check refuses one, but a
        caller of the runner may give it)."""
        record = json.loads(json.dumps(dataclasses.asdict(self)))
        record["environment"] = redacted(self.environment)
        record["command"] = self.command()
        return record

    @classmethod
    def from_record(cls, record: Mapping) -> LaunchPlan:
        hidden = sorted(k for k, v in record["environment"].items() if v == REDACTED)
        if hidden:
            raise ValueError(
                f"the plan's environment holds {', '.join(hidden)} redacted: a "
                "secret reaches the server by name (the arm's secret_environment)"
            )
        values = {field.name: record[field.name] for field in dataclasses.fields(cls)}
        container = values["container"]
        if container is not None:
            mounts = ("read_only_mounts", "writable_mounts")
            container = ContainerOptions(
                **container | {m: _pairs(container[m]) for m in mounts}
            )
        return cls(
            **values
            | {name: tuple(values[name]) for name in _TUPLES}
            | {
                "quota": Quota(**values["quota"]),
                "expected": Expected(
                    **{k: _frozen(v) for k, v in values["expected"].items()}
                ),
                "container": container,
            }
        )


_TUPLES = ("argv", "secret_environment", "host_environment")


def _frozen(value):
    return tuple(value) if isinstance(value, list) else value


def _pairs(items) -> tuple[tuple[str, str], ...]:
    return tuple((str(source), str(target)) for source, target in items)


def process_plan(
    argv: list[str],
    quota_cores: float | None = None,
    *,
    timing: str = "start",
    scope: str = "server",
    stop_leader_only: bool = False,
) -> LaunchPlan:
    """The plan of a process tree that is no engine's server (a benchmark's load,
    a test's): what the local runtime does with it is what it does to a server's
    cgroup, quota and teardown."""
    return LaunchPlan(
        engine="process",
        argv=tuple(argv),
        port=None,
        environment={},
        secret_environment=(),
        host_environment=HOST_VARIABLES,
        working_directory=None,
        quota=Quota(quota_cores, scope, timing),
        stop_signal="SIGTERM",
        stop_leader_only=stop_leader_only,
        served_model_name="",
        expected=Expected("", "", (), (), reported_in="server_info"),
    )
