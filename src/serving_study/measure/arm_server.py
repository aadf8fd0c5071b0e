"""What an arm's server is: its command, environment, model and CPU quota.

An arm runs either the embedded engine with the variant's source, or SGLang's
``launch_server`` with the model; either on this host or in a container of the
variant's image. These functions turn the arm, its engine settings and its
variant into what the server is started with and what the client sends.
"""

import sys

from serving_study.config.platform import (
    PROJECT_ROOT,
    SGLangPlatform,
    compile_cache,
    platform_for,
    python_path,
)
from serving_study.measure.server_log_facts import REPORT_MODULES_VARIABLE
from serving_study.servers.commands import embedded_server_argv
from serving_study.servers.sglang_commands import (
    model_mount,
    served_model_name,
    sglang_server_argv,
    sglang_server_environment,
)
from serving_study.sources.images import EMBEDDED_PYTHON, EMBEDDED_VARIANT_ROOT
from serving_study.sources.variants import changed_modules


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
