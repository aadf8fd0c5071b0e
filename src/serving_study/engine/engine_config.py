"""What one engine process is started with.

Kept free of heavy imports: the command line builds it, and starts the scheduler
process, before the main process loads torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from serving_study.engine.protocol import CPU_TRANSPORT
from serving_study.engine.scheduler import SchedulerSettings, TimingModel


@dataclass(frozen=True)
class EngineConfig:
    sglang_source: Path
    host: str = "127.0.0.1"
    port: int = 30000
    transport: str = CPU_TRANSPORT
    served_model_name: str = "Qwen/Qwen3-VL-4B-Instruct"
    timing: TimingModel = field(default_factory=TimingModel)
    startup_timeout_s: float = 120.0
    # auto: on the GPU when there is one (as SGLang does), else with numpy.
    preprocess_device: str = "auto"
    # None leaves torch's own default, as SGLang does; a number is forced with
    # torch.set_num_threads, which (unlike OMP_NUM_THREADS) may exceed the CPUs.
    intra_op_threads: int | None = None

    def scheduler_settings(self, mm_utils_sha256: str) -> SchedulerSettings:
        """What this process starts its scheduler with, for the variant's file."""
        return SchedulerSettings(
            sglang_source=self.sglang_source,
            mm_utils_sha256=mm_utils_sha256,
            timing=self.timing,
            parent_pid=os.getpid(),
        )
