"""The command line that starts one arm's server, built from config as an argv list.

Values from config are separate list items, never pasted into a shell string.
"""

import sys


def embedded_server_argv(
    *,
    sglang_python_root: str,
    port: int,
    transport: str,
    settings: dict,
    intra_op_threads: int | None = None,
) -> list[str]:
    """``python -m serving_study.engine`` with the variant's SGLang source."""
    forced_threads = (
        []
        if intra_op_threads is None
        else ["--intra-op-threads", str(intra_op_threads)]
    )
    return [
        sys.executable,
        "-m",
        "serving_study.engine",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--sglang-source",
        sglang_python_root,
        "--transport",
        transport,
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
