"""Secrets never live in a config; the server gets them from the runner by name.

Snakemake keeps every job's parameters under ``.snakemake/`` and hands the config to
each script, and the config feeds the records, tables and report. A secret written
in a config would reach all of them, so a config that holds one is refused before
anything reads it: a secret-named variable in an arm's ``environment``, a server
argument that takes a secret (``--api-key``), or a URL with credentials. An arm
names its secrets instead (``secret_environment: [HF_TOKEN]``); the runner passes
each to the server from its own environment (a container gets ``--env NAME``), and
records name them, never their values. No message here repeats a value.
"""

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import pairwise

from serving_study.config.records import Arm

# Words of a variable or flag name that mark it secret, and word pairs
# (OPENAI_API_KEY, --admin-api-key). Whole words, so that TOKENIZERS_PARALLELISM
# and --max-total-tokens are not secrets.
SECRET_WORDS = frozenset(
    "TOKEN SECRET PASSWORD PASSWD PASSPHRASE CREDENTIAL CREDENTIALS APIKEY".split()
)
SECRET_WORD_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY")})
# scheme://authority anywhere in a text (a URL inside an argument or a value).
URL_AUTHORITY = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^\s/?#]*)")
# Schemes whose user name is an account, not a token (ssh://git@host/...).
ACCOUNT_SCHEMES = frozenset({"ssh", "git+ssh", "ssh+git"})
# Values shaped like the access tokens of common services, under whatever name:
# Hugging Face, OpenAI, GitHub (classic and fine-grained), AWS access key ids,
# GitLab and Slack. The envs/server-probe probe keeps a copy of the name rule.
TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{30,}|sk-(?:proj-)?[A-Za-z0-9_-]{20,}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,})"
)

NEVER_IN_CONFIG = (
    "a secret is never written in a config (Snakemake keeps every job's "
    "parameters under .snakemake/, and the config reaches every record)"
)


def is_secret(name: str) -> bool:
    """A variable or flag name that holds a secret: ``HF_TOKEN``, ``--api-key``,
    ``--ssl-keyfile-password``."""
    words = [word for word in re.split(r"[^A-Z0-9]+", name.upper()) if word]
    return any(word in SECRET_WORDS for word in words) or any(
        pair in SECRET_WORD_PAIRS for pair in pairwise(words)
    )


def looks_like_a_token(text: str) -> bool:
    """Whether ``text`` holds a value shaped like a service's access token."""
    return bool(TOKEN_SHAPES.search(text))


def has_credentials(text: str) -> bool:
    """Whether ``text`` holds a URL with a password, or with a user name where a
    token goes (``https://<token>@github.com/...``; ``ssh://git@host`` is fine)."""
    for scheme, authority in URL_AUTHORITY.findall(text):
        if "@" not in authority:
            continue
        user = authority.rsplit("@", 1)[0]
        if ":" in user or scheme.lower() not in ACCOUNT_SCHEMES:
            return True
    return False


def _arguments_problems(arguments, where: str) -> list[str]:
    if not isinstance(arguments, list):
        return []
    problems = []
    for index, argument in enumerate(arguments):
        if not isinstance(argument, str):
            continue
        flag = argument.split("=", 1)[0]
        if flag.startswith("-") and is_secret(flag):
            problems.append(
                f"{where}[{index}]: {flag} takes a secret, and {NEVER_IN_CONFIG}; "
                "SGLang reads it only from its command line, and the harness's "
                "client sends none: leave it out"
            )
        elif has_credentials(argument):
            problems.append(
                f"{where}[{index}]: holds a URL with credentials, and "
                f"{NEVER_IN_CONFIG}; leave them out of the URL"
            )
        elif looks_like_a_token(argument):
            problems.append(
                f"{where}[{index}]: holds a value shaped like an access token, and "
                f"{NEVER_IN_CONFIG}; leave it out"
            )
    return problems


def _environment_problems(arm: dict, where: str) -> list[str]:
    environment = arm.get("environment")
    if not isinstance(environment, dict):
        return []
    problems = []
    for name, value in environment.items():
        name, value = str(name), str(value)
        if is_secret(name) or has_credentials(value) or looks_like_a_token(value):
            problems.append(
                f"{where}.environment.{name}: looks like a secret, and "
                f"{NEVER_IN_CONFIG}; list {name} under {where}.secret_environment "
                "instead and export it where Snakemake runs: the runner passes "
                "it to the server from its own environment"
            )
    return problems


def _url_problem(url, where: str) -> list[str]:
    if not isinstance(url, str) or not has_credentials(url):
        return []
    return [
        f"{where}: the URL holds credentials, and {NEVER_IN_CONFIG}; give it "
        "without them and let git find them itself (a credential helper, "
        "~/.netrc or GIT_ASKPASS)"
    ]


def _records(config: dict, key: str) -> list[tuple[int, dict]]:
    records = config.get(key)
    if not isinstance(records, list):
        return []
    return [(i, record) for i, record in enumerate(records) if isinstance(record, dict)]


def secret_problems(config: dict) -> list[str]:
    """Every place where ``config`` holds a secret, one line each (any shape of
    config: this runs before the schema)."""
    if not isinstance(config, dict):
        return []
    problems = []
    for index, source in _records(config, "sources"):
        git = source.get("git")
        if isinstance(git, dict):
            problems += _url_problem(git.get("url"), f"sources[{index}].git.url")
    bisect = config.get("bisect")
    if isinstance(bisect, dict):
        problems += _url_problem(bisect.get("repository"), "bisect.repository")
    sglang = config.get("sglang")
    if isinstance(sglang, dict):
        problems += _arguments_problems(
            sglang.get("extra_server_args"), "sglang.extra_server_args"
        )
    for index, arm in _records(config, "arms"):
        where = f"arms[{index}]"
        problems += _environment_problems(arm, where)
        problems += _arguments_problems(arm.get("server_args"), f"{where}.server_args")
    return problems


class SecretNotSet(LookupError):
    """A secret an arm names is not set where the runner runs."""


def missing_secrets(
    arms: Iterable[Arm], environment: Mapping[str, str]
) -> list[tuple[str, str]]:
    """(arm, variable) for each secret an arm names that ``environment`` lacks."""
    return [
        (arm.name, name)
        for arm in arms
        for name in arm.secret_environment
        if not environment.get(name)
    ]


def describe_missing(missing: Sequence[tuple[str, str]]) -> list[str]:
    """One sentence per secret that is not set where the runner runs."""
    return [
        f"arm {arm} passes {name} to its server from the runner's environment "
        f"(secret_environment), but {name} is not set there; export it where "
        "Snakemake runs"
        for arm, name in missing
    ]


def require_secrets(arm: Arm, environment: Mapping[str, str]) -> None:
    """Raise SecretNotSet unless ``environment`` holds every secret ``arm`` names."""
    missing = describe_missing(missing_secrets([arm], environment))
    if missing:
        raise SecretNotSet("; ".join(missing))


# What records show of a secret's value: set, or set to another value than the
# runner's.
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
