"""Old spellings of config keys: each still works, rewritten to the new one with a
warning that names the new key, before the schema checks the config."""

import warnings


def replace_deprecated_keys(config: dict) -> list[str]:
    """Rewrite old spellings of keys in place, warning of each; return problems.

    ``client.quota_during_startup`` became each arm's ``quota_timing``: arms that
    do not set it take what it said.
    """
    client = config.get("client")
    if not isinstance(client, dict) or "quota_during_startup" not in client:
        return []
    during_startup = client.pop("quota_during_startup")
    if not isinstance(during_startup, bool):
        return [f"client.quota_during_startup: {during_startup!r} is not true/false"]
    timing = "start" if during_startup else "healthy"
    for arm in config.get("arms") or []:
        if isinstance(arm, dict):
            arm.setdefault("quota_timing", timing)
    warnings.warn(
        "client.quota_during_startup is deprecated: set quota_timing: "
        f"{timing} on the arms instead (arms without one take it now)",
        FutureWarning,
        stacklevel=2,
    )
    return []
