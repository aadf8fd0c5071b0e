"""Typed records of an experiment's settings: what jobs and functions pass around.

The config is checked against its schema first (validation.py); these records are
built from it right after, and from then on travel instead of config dicts. Each
``from_config`` is the one place where a value is normalised: a ``cpu_quota`` of
``none`` becomes None, environment values become strings, and a key the caller
left out takes the schema's default (read from the schema, never restated here).

``as_config`` gives a record back as plain config values, in a fixed order and
holding only what the record holds. That is what a Snakemake rule passes to its
job, since Snakemake compares a job's params with the last run's to decide whether
to rerun it; the job's script builds the record again with ``from_config``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from serving_study.config.open_loop import (
    OPEN_LOOP_KEYS,
    describe_load,
    open_loop_values,
)
from serving_study.config.platform import SGLangPlatform, platform_for, resolve_device
from serving_study.config.record_fields import (
    config_values,
    field_names,
    given,
    plain_fields,
)
from serving_study.config.schema import property_schema

NO_QUOTA = "none"
LOCK_MODES = tuple(property_schema("host_sharing", "lock")["enum"])
GPU_SAMPLING = {"auto": None, "on": True, "off": False}

# What starting a server reads of the config's engine sections. The rest is for
# other jobs: sglang's port (the launch commands), base image and model source (the
# image and model rules); the container's base image and Python (the image build).
EMBEDDED_SERVER_KEYS = (
    "served_model_name",
    "prefill_ms_per_image",
    "decode_step_ms",
    "max_running_requests",
    "scheduler_busy_fraction",
    "preprocess_device",
)
SGLANG_SERVER_KEYS = (
    "model",
    "served_model_name",
    "disable_radix_cache",
    "mm_preprocess_cache_size_mb",
    "mem_fraction_static",
    "max_total_tokens",
    "vlm_cache_size_mb",
    "mm_feature_cache_mb",
    "extra_server_args",
)
CONTAINER_SERVER_KEYS = ("shm_size", "ipc_host", "gpus")


def quota_cores(cpu_quota: float | str | None) -> float | None:
    """A config's ``cpu_quota`` in cores: None for ``none`` (no quota)."""
    if cpu_quota is None or cpu_quota == NO_QUOTA:
        return None
    return float(cpu_quota)


def quota_value(cores: float | None) -> float | str:
    """Cores as a config writes them: ``none`` for no quota."""
    return NO_QUOTA if cores is None else cores


@dataclass(frozen=True)
class Arm:
    """One arm (an item of the config's ``arms``): what each of its runs starts,
    sends and checks. ``cpu_quota`` is in cores, None to run without a quota.

    How many runs it gets is the workflow's business, not a run's, so ``runs``
    (and the free-text ``description``) are not part of it.
    ``request_rate`` and ``burstiness`` make an open loop (open_loop.py), at
    most ``concurrency`` in flight; both are None in a closed loop.
    """

    name: str
    variant: str
    workload: str
    transport: str
    cpu_quota: float | None
    quota_scope: str
    quota_timing: str
    environment: Mapping[str, str]
    secret_environment: tuple[str, ...]
    concurrency: int
    request_rate: float | None
    burstiness: float | None
    requests: int
    output_tokens: int
    intra_op_threads: int | None
    server_args: tuple[str, ...]

    @classmethod
    def from_config(cls, section: Mapping) -> Arm:
        names = [name for name in field_names(cls) if name not in OPEN_LOOP_KEYS]
        values = config_values(section, names, "arms")
        threads = values["intra_op_threads"]
        return cls(
            **plain_fields(cls, values),
            **open_loop_values(section),
            cpu_quota=quota_cores(values["cpu_quota"]),
            environment={
                str(name): str(value) for name, value in values["environment"].items()
            },
            secret_environment=tuple(values["secret_environment"]),
            intra_op_threads=None if threads is None else int(threads),
            server_args=tuple(values["server_args"]),
        )

    def as_config(self) -> dict:
        config = dataclasses.asdict(self) | {
            "cpu_quota": quota_value(self.cpu_quota),
            "environment": dict(self.environment),
            "secret_environment": list(self.secret_environment),
            "server_args": list(self.server_args),
        }
        if self.request_rate is None:
            for name in OPEN_LOOP_KEYS:
                del config[name]
        return config

    @property
    def load(self) -> str:
        return describe_load(self.concurrency, self.request_rate, self.burstiness)


@dataclass(frozen=True)
class Variant:
    """A prepared variant (``results/<experiment>/variants/<name>.json``): the tree
    its server imports, the ``mm_utils.py`` hash a run checks the server loaded, and
    the whole identity record, which provenance keeps as it is."""

    name: str
    sglang_python_root: str
    mm_utils_sha256: str
    identity: Mapping

    @classmethod
    def from_identity(cls, identity: Mapping) -> Variant:
        return cls(
            name=str(identity["name"]),
            sglang_python_root=str(identity["sglang_python_root"]),
            mm_utils_sha256=str(identity["mm_utils_sha256"]),
            identity=dict(identity),
        )


@dataclass(frozen=True)
class Workload:
    """One seeded workload (an item of the config's ``workloads``)."""

    name: str
    seed: int
    images: int
    width: int
    height: int
    format: str
    jpeg_quality: int
    content: str
    input_tokens: int

    @classmethod
    def from_config(cls, section: Mapping) -> Workload:
        values = config_values(section, field_names(cls), "workloads")
        return cls(**plain_fields(cls, values))

    def as_config(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class BoundSource:
    """Where a claim's bound came from (its ``bound_from``): the study, our own
    reasoning, a pilot or a redesign (``kind``); for a pilot or a redesign, its
    figures and the ``<commit>:<path>`` they are committed in (None: nowhere)."""

    kind: str
    what: str
    result: str | None
    committed: str | None

    @classmethod
    def from_config(cls, section: Mapping) -> BoundSource:
        values = config_values(section, field_names(cls), "claims", "bound_from")
        return cls(
            **plain_fields(cls, values),
            result=values["result"],
            committed=values["committed"] or None,
        )


@dataclass(frozen=True)
class ServerSettings:
    """What starting any arm's server needs besides the arm: the engine and where
    it runs, with the one engine section it reads (``embedded`` or ``sglang``,
    the other None), and ``container`` when servers run as containers.

    ``device`` is where a real SGLang server runs (cpu or cuda, ``auto``
    resolved on this host), ``torch`` whose torch it runs with (``platform``
    follows from both). The rest is known only once a job has its input files:
    the variant's image id file, the model snapshot, the runtime the workflow
    built (its Python, and the folder of packages it put beside a host's own).
    """

    engine: str
    runtime: str
    device: str | None
    embedded: Mapping | None
    sglang: Mapping | None
    container: Mapping | None
    image_id_file: str | None = None
    model_host_path: str | None = None
    model_load_format: str | None = None
    model_dtype: str | None = None
    runtime_python: str | None = None
    torch: str | None = None
    runtime_site: str | None = None

    @classmethod
    def from_config(
        cls,
        config: Mapping,
        *,
        image_id_file: str | Path | None = None,
        model_snapshot: Mapping | None = None,
        runtime_record: Mapping | None = None,
    ) -> ServerSettings:
        """From a config (or ``as_config``'s part of one); ``model_snapshot`` is
        the model rule's record, ``runtime_record`` the record of the runtime the
        workflow built for the server (``platform.runtime_record``)."""
        engine, runtime = str(config["engine"]), str(config["runtime"])
        sections = {"embedded": None, "sglang": None, "container": None}
        device = torch = None
        if engine == "embedded":
            section = config.get("embedded_engine", {})
            sections["embedded"] = config_values(
                section, EMBEDDED_SERVER_KEYS, "embedded_engine"
            )
        else:
            section = config.get("sglang", {})
            keys = (*SGLANG_SERVER_KEYS, "device", "torch")
            values = given(config_values(section, keys, "sglang"))
            device = resolve_device(values.pop("device"))
            torch = str(values.pop("torch"))
            platform_for(device, torch)  # refuses a pair no platform has
            sections["sglang"] = values
        if runtime != "local":
            section = config.get("container", {})
            values = config_values(section, CONTAINER_SERVER_KEYS, "container")
            sections["container"] = given(values)
        snapshot, built = model_snapshot or {}, runtime_record or {}
        return cls(
            engine=engine,
            runtime=runtime,
            device=device,
            **sections,
            image_id_file=None if image_id_file is None else str(image_id_file),
            model_host_path=snapshot.get("path"),
            model_load_format=snapshot.get("load_format"),
            model_dtype=snapshot.get("settings", {}).get("dtype"),
            runtime_python=built.get("python"),
            torch=torch,
            runtime_site=built.get("site"),
        )

    def as_config(self) -> dict:
        """The config values of the settings, an optional key that is not set as
        None (what a job's files add is not in it: the job passes those to
        ``from_config`` itself)."""
        config: dict = {"engine": self.engine, "runtime": self.runtime}
        if self.embedded is not None:
            config["embedded_engine"] = dict(self.embedded)
        if self.sglang is not None:
            config["sglang"] = {
                **{name: self.sglang.get(name) for name in SGLANG_SERVER_KEYS},
                "device": self.device,
                "torch": self.torch,
            }
        if self.container is not None:
            config["container"] = {
                name: self.container.get(name) for name in CONTAINER_SERVER_KEYS
            }
        return config

    @property
    def in_container(self) -> bool:
        return self.runtime != "local"

    @property
    def platform(self) -> SGLangPlatform | None:
        """Where a real SGLang server runs (config/platform.py); None for the
        embedded engine."""
        return None if self.device is None else platform_for(self.device, self.torch)


@dataclass(frozen=True)
class ClientSettings:
    """The load client's settings (the config's ``client``)."""

    warmup_requests: int
    health_timeout_s: float
    request_timeout_s: float
    max_dispatch_lag_ms: float

    @classmethod
    def from_config(cls, section: Mapping) -> ClientSettings:
        values = config_values(section, field_names(cls), "client")
        return cls(**plain_fields(cls, values))

    def as_config(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class MonitorSettings:
    """How the run monitors sample (the config's ``monitors``); ``gpu`` None
    samples a GPU when the host has one."""

    sample_hz: float
    thread_sample_hz: float
    gpu: bool | None

    @classmethod
    def from_config(cls, section: Mapping) -> MonitorSettings:
        values = config_values(section, field_names(cls), "monitors")
        if values["gpu"] not in GPU_SAMPLING:
            raise ValueError(f"monitors.gpu {values['gpu']!r}: one of auto, on, off")
        return cls(**plain_fields(cls, values), gpu=GPU_SAMPLING[values["gpu"]])

    def as_config(self) -> dict:
        gpu = next(name for name, value in GPU_SAMPLING.items() if value is self.gpu)
        return dataclasses.asdict(self) | {"gpu": gpu}


@dataclass(frozen=True)
class HostSharing:
    """How runs share the host (the config's ``host_sharing``; measure/
    host_sharing.py holds the lock it describes)."""

    lock: str
    lock_wait_s: float
    lock_file: Path
    max_other_load_cores: float
    max_steal_cores: float
    retries: int
    quiet_for_s: float
    quiet_wait_s: float

    @classmethod
    def from_config(cls, section: Mapping) -> HostSharing:
        values = config_values(section, field_names(cls), "host_sharing")
        if values["lock"] not in LOCK_MODES:
            raise ValueError(
                f"host_sharing.lock {values['lock']!r}: one of {LOCK_MODES}"
            )
        return cls(**plain_fields(cls, values), lock_file=Path(values["lock_file"]))

    def as_config(self) -> dict:
        return dataclasses.asdict(self) | {"lock_file": str(self.lock_file)}
