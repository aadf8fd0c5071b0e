"""The checks of a config's sections that the schema cannot express (validation.py
runs them after the schema): the fixes compared, the threads x quota map, the
client cross-check, a release series, the bisect, and the server's own settings
(the host's torch, a tiny model's shape, extra server arguments). Each returns one
line per problem, naming the key and the fix."""

from collections.abc import Iterable

from packaging.version import InvalidVersion, Version

from serving_study.config.platform import platform_for, resolve_device
from serving_study.config.records import quota_cores
from serving_study.config.schema import property_schema
from serving_study.config.server_arguments import server_argument_conflicts


def must_name(value, known: Iterable[str], where: str, what: str) -> list[str]:
    """A name that must be one of ``known`` (``what`` says of what)."""
    known = list(known)
    if value in known:
        return []
    return [f"{where}: {value!r} names no {what} (known: {', '.join(known) or 'none'})"]


def fixes_problems(fixes: dict | None, arms: list[dict]) -> list[str]:
    """The "which fix" section compares like with like: every arm it names exists,
    each fix runs under the baseline's quota, and each without_quota arm has none."""
    if not fixes:
        return []
    quota_of = {arm["name"]: arm.get("cpu_quota") for arm in arms}
    baseline_quota = quota_of.get(fixes["baseline"]["arm"])
    problems = []
    entries = [("fixes.baseline", fixes["baseline"])] + [
        (f"fixes.fixes[{index}]", fix) for index, fix in enumerate(fixes["fixes"])
    ]
    for where, entry in entries:
        for key in ("arm", "without_quota"):
            if key not in entry:
                continue
            named = entry[key]
            if named not in quota_of:
                problems += must_name(named, quota_of, f"{where}.{key}", "arm")
            elif key == "without_quota" and quota_cores(quota_of[named]) is not None:
                problems.append(
                    f"{where}.without_quota: arm {named!r} runs under a quota "
                    f"({quota_of[named]}); give it cpu_quota: none"
                )
            elif key == "arm" and quota_of[named] != baseline_quota:
                problems.append(
                    f"{where}.arm: arm {named!r} runs under quota "
                    f"{quota_of[named]}, the baseline under {baseline_quota}; "
                    "a fix is compared under the same quota"
                )
    return problems


def thread_quota_map_problems(
    config: dict, variant_names: list[str], workload_names: list[str]
) -> list[str]:
    """The map names known variants and a workload, and runs the embedded engine
    on this host (it forces intra-op threads and rewrites a live cgroup's quota)."""
    settings = config.get("thread_quota_map")
    if not settings:
        return []
    problems = []
    for index, variant in enumerate(settings["variants"]):
        problems += must_name(
            variant, variant_names, f"thread_quota_map.variants[{index}]", "variant"
        )
    problems += must_name(
        settings["workload"], workload_names, "thread_quota_map.workload", "workload"
    )
    if config.get("engine") != "embedded" or config.get("runtime") != "local":
        problems.append(
            "thread_quota_map: the map needs engine 'embedded' and runtime 'local' "
            "(it forces the main process's intra-op threads and changes the quota "
            "of the running server's cgroup)"
        )
    quotas = [quota_cores(quota) for quota in settings["cpu_quotas"]]
    if len(set(quotas)) != len(quotas):
        problems.append("thread_quota_map.cpu_quotas: a quota is listed twice")
    return problems


def crosscheck_problems(config: dict, arm_names: list[str]) -> list[str]:
    """The client cross-check names a closed-loop arm: bench_serving 0.5.23 draws
    its own Poisson arrivals, with no burstiness, so an open loop's would differ."""
    settings = config.get("client_crosscheck")
    if not settings:
        return []
    where = "client_crosscheck.arm"
    problems = must_name(settings["arm"], arm_names, where, "arm")
    arm = next((arm for arm in config["arms"] if arm["name"] == settings["arm"]), {})
    if arm.get("request_rate") is not None:
        problems.append(
            f"{where}: arm {settings['arm']!r} sets request_rate; the cross-check "
            "compares closed loops (bench_serving 0.5.23 draws its own arrivals)"
        )
    return problems


def release_series_problems(config: dict) -> list[str]:
    """A release series lists its PyPI releases in ascending version order."""
    if not config.get("release_series"):
        return []
    variants = {variant["name"]: variant for variant in config.get("variants", [])}
    sources = {source["name"]: source for source in config.get("sources", [])}
    problems = []
    previous = None
    for index, arm in enumerate(config.get("arms", [])):
        source = sources.get(variants.get(arm["variant"], {}).get("source"), {})
        if "pypi" not in source:
            continue
        try:
            version = Version(source["pypi"]["version"])
        except InvalidVersion:
            problems.append(
                f"arms[{index}]: release {source['pypi']['version']!r} is not a "
                "PyPI version, so the release order cannot be checked"
            )
            continue
        if previous is not None and version <= previous[1]:
            problems.append(
                f"arms[{index}]: release {version} comes after {previous[1]} "
                f"(arms[{previous[0]}]); with release_series the arms must list "
                "releases in ascending order, each once"
            )
        previous = (index, version)
    return problems


def bisect_problems(config: dict, arm_names: list[str]) -> list[str]:
    """The commit bisect names an arm of the config and two different ends."""
    bisect = config.get("bisect")
    if not bisect:
        return []
    problems = must_name(bisect["arm"], arm_names, "bisect.arm", "arm")
    if bisect["good"] == bisect["bad"]:
        problems.append(
            "bisect: good and bad are the same revision; give the older commit "
            "(before the change) as good and the newer one as bad"
        )
    return problems


def host_torch_problems(config: dict) -> list[str]:
    """The host's torch (sglang.torch: host) is a local GPU server's choice."""
    sglang = config.get("sglang", {})
    if config.get("engine") != "sglang" or sglang.get("torch") != "host":
        return []
    problems = []
    if sglang.get("device") != "cuda":
        problems.append(
            "sglang.torch: host needs sglang.device: cuda (on CPU the workflow "
            "builds SGLang's pinned stack; auto could resolve to cpu)"
        )
    if config.get("runtime") != "local":
        problems.append(
            "sglang.torch: host needs runtime: local (an image has SGLang's own stack)"
        )
    return problems


def tiny_model_problems(tiny_model: dict | None) -> list[str]:
    """A shape other than tiny fixes every size itself."""
    if not tiny_model or tiny_model.get("shape", "tiny") == "tiny":
        return []
    sizes = property_schema("sglang", "tiny_model")["properties"]
    return [
        f"sglang.tiny_model.{key}: {tiny_model[key]} sets a size of shape tiny; "
        f"shape {tiny_model['shape']} has its own, so leave it out"
        for key in (
            "text_hidden_size",
            "text_layers",
            "vision_hidden_size",
            "vision_depth",
        )
        if key in tiny_model and tiny_model[key] != sizes[key]["default"]
    ]


def server_argument_problems(config: dict) -> list[str]:
    """Extra SGLang arguments that would set a flag a config key or the real
    server's platform sets, in any spelling SGLang's parser takes
    (``--hos=0.0.0.0`` sets --host)."""
    sglang = config.get("sglang", {})
    platform = None
    if config.get("engine") == "sglang":
        try:
            device = resolve_device(sglang.get("device", "auto"))
            platform = platform_for(device, sglang.get("torch", "pinned"))
        except ValueError:
            pass  # a pair no platform has: host_torch_problems says so
    extra = sglang.get("extra_server_args", [])
    problems = server_argument_conflicts(extra, "sglang.extra_server_args", platform)
    for index, arm in enumerate(config.get("arms", [])):
        problems += server_argument_conflicts(
            arm.get("server_args", []), f"arms[{index}].server_args", platform
        )
    return problems
