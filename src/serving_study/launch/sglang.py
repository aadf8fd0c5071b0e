"""The real SGLang server's start: its command line and environment, from config.

One arm of an ``engine: sglang`` experiment becomes ``python -m sglang.launch_server``
with every setting the study held fixed written out, never left to SGLang's
defaults: on a Hopper GPU, SGLang 0.5.23 silently switches Qwen3-VL to the
``cuda_ipc`` feature transport and turns caches on or off by itself, so the
transport, the radix cache and the multimodal caches are always explicit. Values
from config are separate list items, never pasted into a shell string.

The model is mounted read-only into the container at ``/models/<name>``; the server
never reaches the Hugging Face Hub (``HF_HUB_OFFLINE=1``).
"""

import sys
from collections.abc import Mapping
from pathlib import PurePosixPath

from serving_study.config.content_keys import content_key
from serving_study.config.platform import (
    COMPILE_CACHE_VARIABLE,
    PROJECT_ROOT,
    SGLangPlatform,
    compile_cache,
    python_path,
)
from serving_study.config.records import Arm, ServerSettings, Variant
from serving_study.config.server_arguments import server_argument_conflicts
from serving_study.launch.plan import EngineCommand
from serving_study.sources.images import read_image_id
from serving_study.sources.variants import changed_modules

SERVER_MODULE = "sglang.launch_server"
# SGLang's tokenizer manager answers SIGTERM with a drain that it polls every 5 s;
# SIGINT reaches uvicorn, which stops at once (the server is idle by then), and
# launch_server then stops its scheduler and detokenizer itself. It stops its own
# children: a signal to the whole group makes it take a dying child for a crash.
SGLANG_STOP_SIGNAL = "SIGINT"
# What the load probe (envs/server-probe) reports in every server process: the
# modules the variant changed (a patch the server never loads shows), and the
# arm's own variables and secrets as the process sees them (secrets as set or not).
REPORT_MODULES_VARIABLE = "SERVING_STUDY_REPORT_MODULES"
REPORT_VARIABLES_VARIABLE = "SERVING_STUDY_REPORT_VARIABLES"
REPORT_PRESENCE_VARIABLE = "SERVING_STUDY_REPORT_PRESENCE"
CONTAINER_MODELS_DIRECTORY = PurePosixPath("/models")


class ServerArgumentConflict(ValueError):
    """Extra server arguments set a flag that a config key or the platform already
    sets."""


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
    arguments += ["--mm-feature-transport", arm.transport]
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
    arm_args = list(arm.server_args)
    conflicts = server_argument_conflicts(extra, "sglang.extra_server_args", platform)
    conflicts += server_argument_conflicts(
        arm_args, f"arms[{arm.name}].server_args", platform
    )
    if conflicts:
        raise ServerArgumentConflict("; ".join(conflicts))
    return arguments + extra + arm_args


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


def image_engine(platform: SGLangPlatform) -> str | None:
    """The engine part of an SGLang variant image's tag: its Dockerfile's suffix
    (``sglang`` on GPU hosts, ``sglang-cpu`` on CPU); None for a platform whose
    servers never run in a container."""
    if platform.dockerfile is None:
        return None
    return platform.dockerfile.rsplit("Dockerfile.", 1)[1]


def sglang_command(server: ServerSettings, arm: Arm, variant: Variant) -> EngineCommand:
    """``python -m sglang.launch_server`` for one arm, with the environment SGLang
    reads its caches from, offline Hub access, the shared compile cache, what the
    platform needs, the arm's own variables (which win) and the probe's; on this
    host the variant's tree first on the path (an image has its own)."""
    platform = server.platform
    settings, in_container = server.sglang, server.in_container
    model_path = server.model_host_path
    mounts: tuple = ()
    if in_container:
        source, mounted_at, model_path = model_mount(settings["model"], model_path)
        mounts = ((source, mounted_at),)
        python = "python3"
    elif platform.builds_runtime:
        python = server.runtime_python
    else:
        python = sys.executable
    flags = model_flags(server.model_load_format, server.model_dtype)
    arguments = sglang_server_arguments(arm, settings, model_path, platform, flags)
    cache_directory, cache_seen_as = compile_cache(platform, in_container)
    if in_container:
        # One cache per image: a variant's kernels never reach another's server.
        image_id = read_image_id(server.image_id_file)
        cache_directory = cache_directory / image_id.removeprefix("sha256:")[:16]
    patched = tuple(changed_modules(variant.identity, PROJECT_ROOT))
    environment = {
        "SGLANG_VLM_CACHE_SIZE_MB": str(settings["vlm_cache_size_mb"]),
        "SGLANG_MM_FEATURE_CACHE_MB": str(settings["mm_feature_cache_mb"]),
        "HF_HUB_OFFLINE": "1",
        COMPILE_CACHE_VARIABLE: cache_seen_as,
        **platform.environment,
        **arm.environment,
        REPORT_MODULES_VARIABLE: ",".join(patched),
        REPORT_VARIABLES_VARIABLE: ",".join(sorted(arm.environment)),
        REPORT_PRESENCE_VARIABLE: ",".join(sorted(arm.secret_environment)),
    }
    if not in_container:
        environment["PYTHONPATH"] = python_path(
            platform, variant.sglang_python_root, server.runtime_site
        )
    return EngineCommand(
        argv=(python, "-m", SERVER_MODULE, *arguments),
        environment=environment,
        stop_signal=SGLANG_STOP_SIGNAL,
        stop_leader_only=True,
        served_model_name=served_model_name(settings),
        reported_in="log",
        read_only_mounts=mounts,
        writable_mounts=((str(cache_directory), cache_seen_as),)
        if in_container
        else (),
        patched_modules=patched,
        wants_gpus=platform.container_gpus,
    )
