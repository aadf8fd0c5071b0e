"""What an arm's server is: its command, environment and model.

An arm runs either the embedded engine with the variant's source, or SGLang's
``launch_server`` with the model; either on this host or in a container of the
variant's image. These functions turn the arm, the server settings and the
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
from serving_study.config.records import Arm, ServerSettings, Variant
from serving_study.measure.server_log_facts import (
    REPORT_MODULES_VARIABLE,
    REPORT_PRESENCE_VARIABLE,
    REPORT_VARIABLES_VARIABLE,
)
from serving_study.servers.commands import embedded_server_argv
from serving_study.servers.sglang_commands import (
    model_flags,
    model_mount,
    served_model_name,
    sglang_server_argv,
    sglang_server_environment,
)
from serving_study.sources.images import EMBEDDED_PYTHON, EMBEDDED_VARIANT_ROOT
from serving_study.sources.variants import changed_modules


def server_argv(
    server_settings: ServerSettings, variant: Variant, arm: Arm, port: int
) -> list[str]:
    """The command that starts the arm's server: the embedded engine with the
    variant's source, or ``sglang.launch_server`` with the model (in the variant's
    image, or with this host's SGLang when ``runtime: local``)."""
    if server_settings.engine == "sglang":
        return sglang_server_argv(
            arm,
            server_settings.sglang,
            sglang_model_path(server_settings),
            port,
            sglang_platform(server_settings),
            model_flags=model_flags(
                server_settings.model_load_format, server_settings.model_dtype
            ),
            python=sglang_python(server_settings),
        )
    argv = embedded_server_argv(
        sglang_python_root=(
            EMBEDDED_VARIANT_ROOT
            if server_settings.in_container
            else variant.sglang_python_root
        ),
        port=port,
        transport=arm.transport,
        settings=server_settings.embedded,
        intra_op_threads=arm.intra_op_threads,
    )
    if server_settings.in_container:
        argv[0] = EMBEDDED_PYTHON  # the image's interpreter, not this host's
    return argv


def sglang_platform(server_settings: ServerSettings) -> SGLangPlatform:
    return platform_for(server_settings.device)


def shared_compile_cache(server_settings: ServerSettings) -> tuple[str, str]:
    """torch inductor's cache that every arm's server shares, created if new:
    (host directory, path inside the server)."""
    directory, seen_as = compile_cache(
        sglang_platform(server_settings), server_settings.in_container
    )
    directory.mkdir(parents=True, exist_ok=True)
    return str(directory), seen_as


def sglang_python(server_settings: ServerSettings) -> str:
    """The interpreter that runs SGLang: the image's, the runtime the workflow
    built (CPU hosts), or this host's own."""
    if server_settings.in_container:
        return "python3"
    if sglang_platform(server_settings).builds_runtime:
        return server_settings.runtime_python
    return sys.executable


def sglang_model_path(server_settings: ServerSettings) -> str:
    """The model as the SGLang server sees it (mounted inside a container)."""
    host_path = server_settings.model_host_path
    if not server_settings.in_container:
        return host_path
    return model_mount(server_settings.sglang["model"], host_path)[2]


def arm_environment(
    server_settings: ServerSettings, arm: Arm, variant: Variant | None = None
) -> dict[str, str]:
    """What the arm's config sets in the server's environment (and, for SGLang,
    the cache settings SGLang only reads from the environment, and on this host
    the variant's tree first on the path; an image has its own)."""
    if server_settings.engine != "sglang":
        return dict(arm.environment)
    platform = sglang_platform(server_settings)
    environment = sglang_server_environment(
        arm, server_settings.sglang, platform, server_settings.in_container
    )
    if variant is not None:
        # The load probe reports these too: a patch the server never loads shows.
        environment[REPORT_MODULES_VARIABLE] = ",".join(
            changed_modules(variant.identity, PROJECT_ROOT)
        )
    # ... and what the server's processes see of the arm's own variables.
    environment[REPORT_VARIABLES_VARIABLE] = ",".join(sorted(arm.environment))
    environment[REPORT_PRESENCE_VARIABLE] = ",".join(sorted(arm.secret_environment))
    if not server_settings.in_container and variant is not None:
        environment["PYTHONPATH"] = python_path(platform, variant.sglang_python_root)
    return environment


def model_name(server_settings: ServerSettings) -> str:
    """The ``model`` the client sends."""
    if server_settings.engine == "sglang":
        return served_model_name(server_settings.sglang)
    return server_settings.embedded["served_model_name"]
