"""Command line: `python -m serving_study.engine --sglang-source DIR ...`."""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from serving_study.engine.engine_config import EngineConfig
from serving_study.engine.protocol import CPU_TRANSPORT, TRANSPORTS
from serving_study.engine.request_path import PREPROCESS_DEVICES
from serving_study.engine.scheduler import (
    EarlyScheduler,
    TimingModel,
    exit_without_teardown,
    start_scheduler,
)
from serving_study.engine.shm_loader import MM_UTILS_RELATIVE_PATH


def parse_arguments(argv: list[str]) -> EngineConfig:
    defaults = EngineConfig(sglang_source=Path("."))
    timing = TimingModel()
    parser = argparse.ArgumentParser(
        prog="python -m serving_study.engine",
        description=(
            "OpenAI-compatible server running SGLang's multimodal request path "
            "(the variant's own ShmPointerMMData) with a stand-in timing model "
            "instead of the model."
        ),
    )
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument(
        "--sglang-source",
        type=Path,
        required=True,
        help="directory containing sglang/srt/managers/mm_utils.py (the variant)",
    )
    parser.add_argument("--transport", choices=TRANSPORTS, default=defaults.transport)
    parser.add_argument("--served-model-name", default=defaults.served_model_name)
    parser.add_argument(
        "--prefill-ms-per-image",
        type=float,
        default=timing.prefill_ms_per_image,
        help="stand-in prefill cost per image; produces the first token",
    )
    parser.add_argument(
        "--decode-step-ms",
        type=float,
        default=timing.decode_step_ms,
        help="one decode step for the whole running batch (one token each)",
    )
    parser.add_argument(
        "--max-running-requests", type=int, default=timing.max_running_requests
    )
    parser.add_argument(
        "--scheduler-busy-fraction",
        type=float,
        default=timing.busy_fraction,
        help="share of each step the scheduler spins instead of sleeping (0-1)",
    )
    parser.add_argument(
        "--startup-timeout-s", type=float, default=defaults.startup_timeout_s
    )
    parser.add_argument(
        "--preprocess-device",
        choices=("auto", *PREPROCESS_DEVICES),
        default=defaults.preprocess_device,
        help="where images are preprocessed (auto: the GPU when there is one)",
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        help=(
            "force the main process's torch intra-op threads (torch.set_num_threads; "
            "may exceed the CPUs); by default torch picks, as in SGLang"
        ),
    )
    arguments = parser.parse_args(argv)
    try:
        timing = TimingModel(
            prefill_ms_per_image=arguments.prefill_ms_per_image,
            decode_step_ms=arguments.decode_step_ms,
            max_running_requests=arguments.max_running_requests,
            busy_fraction=arguments.scheduler_busy_fraction,
        )
    except ValueError as error:
        parser.error(str(error))
    if arguments.intra_op_threads is not None and arguments.intra_op_threads < 1:
        parser.error("--intra-op-threads must be at least 1")
    return EngineConfig(
        sglang_source=arguments.sglang_source.resolve(),
        host=arguments.host,
        port=arguments.port,
        transport=arguments.transport,
        served_model_name=arguments.served_model_name,
        timing=timing,
        startup_timeout_s=arguments.startup_timeout_s,
        preprocess_device=arguments.preprocess_device,
        intra_op_threads=arguments.intra_op_threads,
    )


def start_scheduler_early(config: EngineConfig) -> EarlyScheduler | None:
    """Start the scheduler process now, so that it loads torch while this process
    does (each import takes seconds on a small host). The engine checks that the
    settings match what it loads; a variant it cannot read starts nothing here."""
    if config.transport != CPU_TRANSPORT:
        return None  # the engine first checks for a GPU, which needs torch
    try:
        mm_utils_text = (config.sglang_source / MM_UTILS_RELATIVE_PATH).read_text()
    except OSError:
        return None
    settings = config.scheduler_settings(
        hashlib.sha256(mm_utils_text.encode()).hexdigest()
    )
    process, connection = start_scheduler(settings)
    return settings, process, connection


def main(argv: list[str] | None = None) -> int:
    config = parse_arguments(sys.argv[1:] if argv is None else argv)
    early_scheduler = start_scheduler_early(config)
    # Imported only now: the server loads torch, in parallel with the scheduler.
    from serving_study.engine.server import run_engine

    return run_engine(config, early_scheduler)


if __name__ == "__main__":
    # After a clean stop the scheduler is gone and every segment released: skip the
    # interpreter's slow teardown of torch. An exception still ends the usual way.
    exit_without_teardown(main())
