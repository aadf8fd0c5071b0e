"""The environment a server starts with: the host's, minus thread knobs, plus the arm's.

An arm's intra-op thread count is part of what it measures, so no thread setting may
leak into a server from the shell or from Snakemake, which exports OMP_NUM_THREADS
and friends to every job. "Default threads" then really means PyTorch's default on
this host, and a cap is exactly what the arm's ``environment`` says.
"""

from collections.abc import Collection, Mapping

from serving_study.config.secrets import is_secret

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

# What records show of a secret's value (config_secrets.py): set, or set to another
# value than the runner's.
REDACTED = "<redacted>"
REDACTED_OTHER = "<redacted: not the runner's value>"


def redacted(
    environment: Mapping[str, str | None], secret_names: Collection[str] = ()
) -> dict[str, str | None]:
    """The environment with every secret value replaced (an unset one stays None),
    for records: names that look secret, and the ones an arm passes as secrets."""
    return {
        name: REDACTED
        if value is not None and (is_secret(name) or name in secret_names)
        else value
        for name, value in environment.items()
    }


def redacted_check(
    expected: Mapping[str, str | None],
    seen: Mapping[str, str | None],
    secret_names: Collection[str] = (),
) -> tuple[dict, dict]:
    """Both sides of an environment check, fit for records, that still compare
    equal exactly when the values do: a secret the server holds with another value
    shows as REDACTED_OTHER."""
    seen_record = redacted(seen, secret_names)
    for name, value in seen_record.items():
        if value == REDACTED and seen[name] != expected.get(name):
            seen_record[name] = REDACTED_OTHER
    return redacted(expected, secret_names), seen_record


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


def recorded_environment(
    environment: Mapping[str, str], secret_names: Collection[str] = ()
) -> dict[str, str]:
    """The settings worth recording in provenance: thread knobs, SGLang's, torch's,
    the Hub's and the load probe's variables, never a secret."""
    return {
        name: value
        for name, value in sorted(environment.items())
        if (name in THREAD_SETTINGS or name.startswith(RECORDED_PREFIXES))
        and not is_secret(name)
        and name not in secret_names
    }
