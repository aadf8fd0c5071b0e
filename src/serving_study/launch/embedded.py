"""The embedded engine's start: ``python -m serving_study.engine`` with the variant's
SGLang source, on this host or in the variant's image.

Values from config are separate list items, never pasted into a shell string.
"""

import sys

from serving_study.config.records import Arm, ServerSettings, Variant
from serving_study.launch.plan import EngineCommand
from serving_study.sources.images import EMBEDDED_PYTHON, EMBEDDED_VARIANT_ROOT


def embedded_command(
    server: ServerSettings, arm: Arm, variant: Variant
) -> EngineCommand:
    settings = server.embedded
    forced_threads = []
    if arm.intra_op_threads is not None:
        forced_threads = ["--intra-op-threads", str(arm.intra_op_threads)]
    in_container = server.in_container
    argv = [
        EMBEDDED_PYTHON if in_container else sys.executable,
        "-m",
        "serving_study.engine",
        "--host",
        "127.0.0.1",
        "--sglang-source",
        EMBEDDED_VARIANT_ROOT if in_container else variant.sglang_python_root,
        "--transport",
        arm.transport,
        "--served-model-name",
        settings["served_model_name"],
        "--prefill-ms-per-image",
        str(settings["prefill_ms_per_image"]),
        "--decode-step-ms",
        str(settings["decode_step_ms"]),
        "--max-running-requests",
        str(settings["max_running_requests"]),
        "--scheduler-busy-fraction",
        str(settings["scheduler_busy_fraction"]),
        "--preprocess-device",
        settings["preprocess_device"],
        *forced_threads,
    ]
    return EngineCommand(
        argv=tuple(argv),
        environment=dict(arm.environment),
        stop_signal="SIGTERM",
        stop_leader_only=False,
        served_model_name=settings["served_model_name"],
        reported_in="server_info",
    )
