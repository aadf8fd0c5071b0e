"""The command line and environment of a real SGLang server, built from config.

One arm of an ``engine: sglang`` experiment becomes ``python -m sglang.launch_server``
with every setting the study held fixed written out, never left to SGLang's
defaults: on a Hopper GPU, SGLang 0.5.23 silently switches Qwen3-VL to the
``cuda_ipc`` feature transport and turns caches on or off by itself, so the
transport, the radix cache and the multimodal caches are always explicit. Values
from config are separate list items, never pasted into a shell string.

The model is mounted read-only into the container at ``/models/<name>``; the server
never reaches the Hugging Face Hub (``HF_HUB_OFFLINE=1``).
"""

import signal
from collections.abc import Mapping
from pathlib import PurePosixPath

from serving_study.config.content_keys import content_key
from serving_study.config.platform import (
    COMPILE_CACHE_VARIABLE,
    SGLangPlatform,
    compile_cache,
)
from serving_study.config.records import Arm
from serving_study.config.server_arguments import server_argument_conflicts
from serving_study.servers.container_commands import container_name, run_command
from serving_study.sources.images import image_tag

SERVER_MODULE = "sglang.launch_server"
# SGLang's tokenizer manager answers SIGTERM with a drain that it polls every 5 s;
# SIGINT reaches uvicorn, which stops at once (the server is idle by then), and
# launch_server then stops its scheduler and detokenizer itself.
SGLANG_STOP_SIGNAL = signal.SIGINT
CONTAINER_MODELS_DIRECTORY = PurePosixPath("/models")


class ServerArgumentConflict(ValueError):
    """Extra server arguments set a flag that a config key already sets."""


def model_directory_name(model: str) -> str:
    """A file name for a Hub model id: ``Qwen/Qwen3-VL-4B-Instruct`` ->
    ``Qwen--Qwen3-VL-4B-Instruct``."""
    return model.replace("/", "--")


MODEL_SOURCE_KEYS = ("model", "model_revision", "model_path")


def model_source(sglang: dict) -> dict:
    """What the config's sglang section says of where the model comes from."""
    return {key: sglang[key] for key in MODEL_SOURCE_KEYS if key in sglang}


def model_folder_name(sglang: dict) -> str:
    """The model's folder under resources/models/: its id and its source's hash,
    so experiments that name one model at two revisions keep two folders."""
    return content_key(model_directory_name(sglang["model"]), model_source(sglang))


def container_model_path(model: str) -> str:
    """Where the model snapshot is mounted inside the server's container."""
    return str(CONTAINER_MODELS_DIRECTORY / model_directory_name(model))


def model_mount(model: str, model_host_path: str) -> tuple[str, str, str]:
    """(host directory to mount, where it is mounted, the model path inside).

    A snapshot in a Hugging Face cache (``.../models--X/snapshots/<commit>``) holds
    links into the cache's ``blobs/``, so the whole model folder is mounted.
    """
    mounted_at = container_model_path(model)
    host_path = PurePosixPath(model_host_path)
    if host_path.parent.name == "snapshots":
        inside = f"{mounted_at}/snapshots/{host_path.name}"
        return str(host_path.parent.parent), mounted_at, inside
    return str(host_path), mounted_at, mounted_at


def served_model_name(sglang_settings: Mapping) -> str:
    """The name clients send as ``model``; the Hub id unless config names another."""
    return sglang_settings.get("served_model_name") or sglang_settings["model"]


def sglang_server_arguments(
    arm: Arm,
    sglang_settings: Mapping,
    model_path: str,
    port: int,
    platform: SGLangPlatform,
    model_flags: tuple[str, ...] = (),
) -> list[str]:
    """The arguments after ``python -m sglang.launch_server`` for one arm.

    ``sglang_settings`` is the config's ``sglang`` section with the schema's
    defaults filled in (``ServerSettings.sglang`` holds what a server reads of
    it); ``model_path`` is the model as the server sees it (the container path
    when the server runs in a container); ``platform`` adds what the device
    needs; ``model_flags`` what the model snapshot needs (``model_flags()``).
    """
    arguments = ["--model-path", model_path, "--host", "127.0.0.1"]
    arguments += list(platform.server_flags) + list(model_flags)
    arguments += ["--port", str(port), "--mm-feature-transport", arm.transport]
    if sglang_settings["disable_radix_cache"]:
        arguments.append("--disable-radix-cache")
    arguments += [
        "--mm-preprocess-cache-size-mb",
        str(sglang_settings["mm_preprocess_cache_size_mb"]),
    ]
    for key, flag in (
        ("mem_fraction_static", "--mem-fraction-static"),
        ("max_total_tokens", "--max-total-tokens"),
    ):
        if key in sglang_settings:
            arguments += [flag, str(sglang_settings[key])]
    arguments += ["--served-model-name", served_model_name(sglang_settings)]
    extra = list(sglang_settings.get("extra_server_args", []))
    arm_arguments = list(arm.server_args)
    conflicts = server_argument_conflicts(extra, "sglang.extra_server_args")
    conflicts += server_argument_conflicts(
        arm_arguments, f"arms[{arm.name}].server_args"
    )
    if conflicts:
        raise ServerArgumentConflict("; ".join(conflicts))
    return arguments + extra + arm_arguments


def sglang_server_argv(
    arm: Arm,
    sglang_settings: Mapping,
    model_path: str,
    port: int,
    platform: SGLangPlatform,
    *,
    model_flags: tuple[str, ...] = (),
    python: str = "python3",
) -> list[str]:
    """``python3 -m sglang.launch_server ...`` for one arm (see
    ``sglang_server_arguments``); ``python`` is the interpreter that has SGLang
    (``python3`` in the SGLang image)."""
    return [python, "-m", SERVER_MODULE] + sglang_server_arguments(
        arm, sglang_settings, model_path, port, platform, model_flags
    )


def model_flags(load_format: str | None, dtype: str | None) -> tuple[str, ...]:
    """What a model snapshot needs on the command line: a tiny model has no weight
    files (``--load-format dummy``), and its dtype must be explicit, since under
    ``--dtype auto`` SGLang serves a float32 config as float16."""
    flags: tuple[str, ...] = ()
    if load_format:
        flags += ("--load-format", load_format)
    if dtype:
        flags += ("--dtype", dtype)
    return flags


def sglang_server_environment(
    arm: Arm, sglang_settings: Mapping, platform: SGLangPlatform, in_container: bool
) -> dict[str, str]:
    """The environment variables the server gets from config: the caches that are
    environment-only in SGLang, offline Hub access, the shared compile cache, what
    the platform needs, then the arm's own ``environment`` (which wins)."""
    environment = {
        "SGLANG_VLM_CACHE_SIZE_MB": str(sglang_settings["vlm_cache_size_mb"]),
        "SGLANG_MM_FEATURE_CACHE_MB": str(sglang_settings["mm_feature_cache_mb"]),
        "HF_HUB_OFFLINE": "1",
        COMPILE_CACHE_VARIABLE: compile_cache(platform, in_container)[1],
        **platform.environment,
    }
    environment.update(arm.environment)
    return environment


def arm_launch_commands(
    *,
    experiment: str,
    arm: Arm,
    sglang_settings: Mapping,
    runtime: str,
    model_host_path: str,
    quota_during_startup: bool,
    platform: SGLangPlatform,
    flags_of_model: tuple[str, ...] = (),
) -> dict:
    """Everything that starts one arm's server: its argv, the container argv that
    runs it (None for ``runtime: local``), its environment and the model mount.

    The container has the platform's GPUs, the host's network and IPC namespace,
    the model mounted read-only, and the arm's CPU quota from the start when
    ``quota_during_startup`` (else the runner adds it once the server is healthy).
    """
    model = sglang_settings["model"]
    in_container = runtime != "local"
    mount_source, mounted_at, model_path = model_mount(model, model_host_path)
    if not in_container:
        model_path = model_host_path
    port = sglang_settings["port"]
    server_argv = sglang_server_argv(
        arm, sglang_settings, model_path, port, platform, model_flags=flags_of_model
    )
    environment = sglang_server_environment(
        arm, sglang_settings, platform, in_container
    )
    quota_cores = arm.cpu_quota
    container_argv = None
    if in_container:
        container_argv = run_command(
            runtime=runtime,
            image=image_tag(image_engine(platform), arm.variant),
            command=server_argv,
            name=container_name(f"{experiment}-{arm.name}"),
            label=f"{experiment}-{arm.name}",
            environment=environment,
            passed_environment=arm.secret_environment,
            quota_cores=quota_cores if quota_during_startup else None,
            shm_size=None,
            ipc_host=True,
            gpus="all" if platform.container_gpus else None,
            read_only_mounts=[(mount_source, mounted_at)],
            writable_mounts=[compile_cache(platform, in_container=True)],
            stop_signal=SGLANG_STOP_SIGNAL.name,
        )
    return {
        "experiment": experiment,
        "arm": arm.name,
        "variant": arm.variant,
        "transport": arm.transport,
        "device": platform.device,
        "port": port,
        "quota_cores": quota_cores,
        "quota_from": "start" if quota_during_startup else "healthy",
        "server_argv": server_argv,
        "container_argv": container_argv,
        "environment": environment,
        # Passed by name from the runner's environment; no value is written.
        "secret_environment": list(arm.secret_environment),
        "model": {
            "name": model,
            "revision": sglang_settings.get("model_revision"),
            "host_path": model_host_path,
            "mount": f"{mount_source}:{mounted_at}:ro" if in_container else None,
            "server_path": model_path,
            "flags": list(flags_of_model),
        },
    }


def image_engine(platform: SGLangPlatform) -> str:
    """The engine part of an SGLang variant image's tag: its Dockerfile's suffix
    (``sglang`` on GPU hosts, ``sglang-cpu`` on CPU)."""
    return platform.dockerfile.rsplit("Dockerfile.", 1)[1]
