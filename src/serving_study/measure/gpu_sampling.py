"""The GPU as the monitors see it through NVML: utilisation, and memory per process.

NVML is opened once per monitor set and only when a GPU is wanted or may exist, so
CPU hosts never need the driver. Utilisation is cheap and read with every sample;
the list of processes on the device costs more and is read at most once a second.
A failed read is recorded with the window's figures and sampling goes on.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

GPU_PROCESS_MEMORY_MAX_HZ = 1.0


@dataclass
class GpuSamples:
    """What the samples of one window saw of the GPU."""

    utilisation: list[float] = field(default_factory=list)
    memory_utilisation: list[float] = field(default_factory=list)
    server_memory_bytes: list[int] = field(default_factory=list)
    other_pids: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def note_error(self, error: str) -> None:
        if error not in self.errors:
            self.errors.append(error)


class Gpu:
    """One NVML handle, opened once; cheap utilisation reads and 1 Hz process lists."""

    def __init__(self, index: int) -> None:
        import pynvml  # nvidia-ml-py; imported here so CPU hosts never need the driver

        self._nvml = pynvml
        pynvml.nvmlInit()
        try:
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.description = {
                "index": index,
                "name": _text(pynvml.nvmlDeviceGetName(self._handle)),
                "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
            }
        except Exception:
            pynvml.nvmlShutdown()
            raise

    def sample_utilisation(self, samples: GpuSamples) -> float | None:
        """Add the device's utilisation now to `samples`; its GPU percent, or None
        when NVML failed (recorded)."""
        try:
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        except Exception as error:  # NVMLError: record, keep sampling the CPU side
            samples.note_error(f"utilisation: {error}")
            return None
        samples.utilisation.append(float(rates.gpu))
        samples.memory_utilisation.append(float(rates.memory))
        return float(rates.gpu)

    def sample_memory(self, samples: GpuSamples, server_pids: set[int]) -> None:
        """Add the server's GPU memory now, and note other processes on the device."""
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception as error:
            samples.note_error(f"process list: {error}")
            return
        # Used memory per process on the device (host pids), in bytes.
        memory_by_pid = {process.pid: process.usedGpuMemory for process in processes}
        samples.server_memory_bytes.append(
            sum(used or 0 for pid, used in memory_by_pid.items() if pid in server_pids)
        )
        samples.other_pids |= set(memory_by_pid) - server_pids

    def figures(self, samples: GpuSamples) -> dict:
        """The device and what one window's samples saw of it."""
        utilisation = samples.utilisation
        server_memory = samples.server_memory_bytes
        return {
            **self.description,
            "util_percent_mean": _mean(utilisation),
            "util_percent_median": (
                statistics.median(utilisation) if utilisation else None
            ),
            "util_percent_max": max(utilisation) if utilisation else None,
            "memory_util_percent_mean": _mean(samples.memory_utilisation),
            "memory_used_mib": max(server_memory) / 2**20 if server_memory else None,
            "utilisation_samples": len(utilisation),
            "process_list_samples": len(server_memory),
            "other_compute_pids": sorted(samples.other_pids),
            "errors": samples.errors,
        }

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def open_gpu(wanted: bool | None, index: int = 0) -> tuple[Gpu | None, str | None]:
    """The GPU to sample, or None and why; with `wanted=True` absence is an error."""
    if wanted is False:
        return None, "GPU sampling switched off"
    try:
        return Gpu(index), None
    except Exception as error:  # ImportError, NVMLError_* (no driver, no device)
        reason = f"NVML unavailable: {type(error).__name__}: {error}"
        if wanted:
            raise RuntimeError(
                f"{reason}. GPU monitoring was requested (gpu=True); install the "
                "NVIDIA driver and nvidia-ml-py, or pass gpu=None to record its "
                "absence."
            ) from error
        return None, reason


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
