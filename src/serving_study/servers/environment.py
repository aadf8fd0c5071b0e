"""The environment a server starts with: the host's, minus thread knobs, plus the arm's.

An arm's intra-op thread count is part of what it measures, so no thread setting may
leak into a server from the shell or from Snakemake, which exports OMP_NUM_THREADS
and friends to every job. "Default threads" then really means PyTorch's default on
this host, and a cap is exactly what the arm's ``environment`` says.
"""

from collections.abc import Collection, Mapping

from serving_study.config.secrets import (
    REDACTED,
    has_credentials,
    is_secret,
    looks_like_a_token,
)

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

# The other variables a server's provenance records (recorded_environment).
RECORDED_PREFIXES = ("SGLANG_", "TORCH", "HF_", "SERVING_STUDY_")


def server_environment(
    host_environment: Mapping[str, str], arm_environment: Mapping[str, str]
) -> dict[str, str]:
    kept = {
        name: value
        for name, value in host_environment.items()
        if name not in THREAD_SETTINGS
    }
    return kept | dict(arm_environment)


def recorded_environment(
    environment: Mapping[str, str], secret_names: Collection[str] = ()
) -> dict[str, str]:
    """The settings worth recording in provenance: thread knobs, SGLang's, torch's,
    the Hub's and the load probe's variables, never a secret: one by name is left
    out, a value with credentials in a URL or shaped like a token is redacted."""
    return {
        name: REDACTED if has_credentials(value) or looks_like_a_token(value) else value
        for name, value in sorted(environment.items())
        if (name in THREAD_SETTINGS or name.startswith(RECORDED_PREFIXES))
        and not is_secret(name)
        and name not in secret_names
    }
