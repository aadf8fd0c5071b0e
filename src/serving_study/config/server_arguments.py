"""Extra server arguments may not set again what a config key or the platform
already sets.

The real server's command line is built from config keys and the platform's flags
(``launch/sglang.py``, ``config/platform.py``); an extra argument that sets one of
those flags would silently win over the key, or take the server off the path the
platform's stand-ins and the report's list of differences assume, so the config
check refuses it before any job runs.
"""

from serving_study.config.platform import SGLangPlatform

# Flags the server's command line sets from config keys, with SGLang's aliases.
FLAGS_FROM_CONFIG = {
    "--model-path": "sglang.model_path / sglang.model",
    "--model": "sglang.model_path / sglang.model (SGLang's alias of --model-path)",
    "--host": "the runner (always 127.0.0.1)",
    "--port": "the runner (a free port for each run)",
    "--mm-feature-transport": "arms[].transport",
    "--disable-radix-cache": "sglang.disable_radix_cache",
    "--mm-preprocess-cache-size-mb": "sglang.mm_preprocess_cache_size_mb",
    "--mem-fraction-static": "sglang.mem_fraction_static",
    "--max-total-tokens": "sglang.max_total_tokens",
    "--served-model-name": "sglang.served_model_name",
    "--device": "sglang.device",
    "--load-format": "the model (sglang.tiny_model loads dummy weights)",
    "--dtype": "the model (its config.json, or sglang.tiny_model.dtype)",
}
# Flags whose arguments no check of ours could see.
FLAGS_HIDING_ARGUMENTS = {
    "--config": "makes SGLang read more arguments from a file, where this check "
    "cannot see them; list them here instead",
}


def platform_flags(platform: SGLangPlatform) -> dict[str, str]:
    """The flags a platform puts on every server's command line, each with why an
    extra argument may not set it."""
    return {
        token: (
            f"the platform for sglang.device {platform.device} with sglang.torch "
            f"{platform.torch} sets (config/platform.py): the path this platform's "
            "runs are described by"
        )
        for token in platform.server_flags
        if token.startswith("--")
    }


def server_argument_conflicts(
    arguments: list[str], where: str, platform: SGLangPlatform | None = None
) -> list[str]:
    """One line per argument that would set a flag of ``FLAGS_FROM_CONFIG``,
    ``FLAGS_HIDING_ARGUMENTS`` or the ``platform``'s, in any spelling SGLang's
    parser takes.

    SGLang parses with argparse, which takes ``--flag value``, ``--flag=value`` and
    any unambiguous prefix of ``--flag`` (``--hos=0.0.0.0``), so every ``--``
    argument that is a prefix of such a flag is refused: one that is ambiguous
    among SGLang's flags, SGLang refuses too. A single dash never abbreviates a
    ``--`` flag.
    """
    why = {
        flag: f"comes from {origin}; set it there instead"
        for flag, origin in FLAGS_FROM_CONFIG.items()
    } | FLAGS_HIDING_ARGUMENTS
    if platform is not None:
        why |= platform_flags(platform)
    conflicts = []
    for position, argument in enumerate(arguments):
        spelled = argument.split("=", 1)[0]
        if not spelled.startswith("--") or spelled == "--":
            continue
        matches = [flag for flag in why if flag.startswith(spelled)]
        if matches:
            flag = spelled if spelled in why else matches[0]
            conflicts.append(
                f"{where}[{position}]: {argument!r} sets {flag}, which {why[flag]}"
            )
    return conflicts
