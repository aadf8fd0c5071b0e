"""The environment a server starts with: the host's, minus thread knobs, plus the arm's.

An arm's intra-op thread count is part of what it measures, so no thread setting may
leak into a server from the shell or from Snakemake, which exports OMP_NUM_THREADS
and friends to every job. "Default threads" then really means PyTorch's default on
this host, and a cap is exactly what the arm's ``environment`` says.
"""

from collections.abc import Mapping

THREAD_SETTINGS = (
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "OMP_DYNAMIC",
    "GOMP_SPINCOUNT",
    "GOMP_CPU_AFFINITY",
    "KMP_BLOCKTIME",
    "KMP_AFFINITY",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "TORCH_NUM_THREADS",
)

# Parts of a variable's name that mark it secret: its value reaches the server but
# never a log, a provenance file or the report.
SECRET_NAME_PARTS = ("TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "API_KEY")


def is_secret(name: str) -> bool:
    return any(part in name.upper() for part in SECRET_NAME_PARTS)


def redacted(environment: Mapping[str, str]) -> dict[str, str]:
    """The environment with every secret value replaced, for records."""
    return {
        name: "<redacted>" if is_secret(name) else value
        for name, value in environment.items()
    }


def server_environment(
    host_environment: Mapping[str, str], arm_environment: Mapping[str, str]
) -> dict[str, str]:
    environment = {
        name: value
        for name, value in host_environment.items()
        if name not in THREAD_SETTINGS
    }
    environment.update(arm_environment)
    return environment


def recorded_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """The settings worth recording in provenance: thread knobs and SGLANG_* flags."""
    return {
        name: value
        for name, value in sorted(environment.items())
        if (name in THREAD_SETTINGS or name.startswith("SGLANG_"))
        and not is_secret(name)
    }
