"""What the report reads of the config, as one record built once.

The report job gets the part of the config that rules/common.smk's
``report_config()`` passes (its REPORT_KEYS, and for real SGLang where the server
ran); ``ReportSettings.from_config`` turns that into a record, and the report's
modules read the record, never the dict. Arms are ``Arm`` records and the change
criterion a ``ChangeCriterion``, so each value is normalised where those records
normalise it; a key the config leaves out takes the schema's default.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from serving_study.analysis.release_change import ChangeCriterion
from serving_study.config.platform import SGLangPlatform, platform_for
from serving_study.config.record_fields import config_values
from serving_study.config.records import Arm
from serving_study.sources.tiny_model_settings import TINY

OPTIONAL_KEYS = ("description", "reference", "release_series", "change_criterion")


@dataclass(frozen=True)
class ReportSettings:
    """What the report reads of the config, arms in config order; ``sglang_device``
    is the config's ``sglang.device`` for real SGLang, None for the embedded engine,
    and ``platform`` where its server ran (config/platform.py)."""

    experiment: str
    description: str
    arms: tuple[Arm, ...]
    reference_source: str | None
    release_series: bool
    change_criterion: ChangeCriterion
    engine: str
    sglang_device: str | None
    model: str
    runtime: str = "local"
    container: Mapping | None = None
    platform: SGLangPlatform | None = None

    @classmethod
    def from_config(cls, config: Mapping) -> Self:
        values = config_values(config, OPTIONAL_KEYS)
        engine = str(config["engine"])
        device = platform = None
        sglang = config.get("sglang", {})
        if engine == "sglang":
            where = config_values(sglang, ("device", "torch"), "sglang")
            device = where["device"]
            if device != "auto":
                platform = platform_for(device, where["torch"])
        return cls(
            experiment=str(config["experiment"]),
            description=str(values["description"]),
            arms=tuple(Arm.from_config(arm) for arm in config["arms"]),
            reference_source=values["reference"].get("source"),
            release_series=bool(values["release_series"]),
            change_criterion=ChangeCriterion.from_config(values["change_criterion"]),
            engine=engine,
            sglang_device=device,
            runtime=str(config.get("runtime", "local")),
            container=config.get("container"),
            model=served_by(config, engine, device),
            platform=platform,
        )

    @property
    def arm_names(self) -> list[str]:
        return [arm.name for arm in self.arms]

    @property
    def sglang_on_cpu(self) -> bool:
        """Whether the arms ran SGLang's real server on a CPU host."""
        return self.sglang_device == "cpu"


def served_by(config: Mapping, engine: str, device: str | None) -> str:
    """What served the requests, stand-ins named as such."""
    if engine == "embedded":
        timing = ("prefill_ms_per_image", "decode_step_ms")
        ms = config_values(config.get("embedded_engine", {}), timing, "embedded_engine")
        return (
            "a timed stand-in, not a model (the embedded engine): "
            f"{ms['prefill_ms_per_image']} ms of prefill per image, "
            f"{ms['decode_step_ms']} ms per decode step"
        )
    tiny_model = config.get("sglang", {}).get("tiny_model")
    if tiny_model and tiny_model.get("shape", TINY) != TINY:
        return (
            "a stand-in: a Qwen3-VL with every size of Qwen3-VL-4B-Instruct, random "
            "weights and a seeded tiny tokenizer"
        )
    if device == "cpu" or tiny_model:
        return "a stand-in: a seeded tiny Qwen3-VL with random weights"
    return "the real model (SGLang's server on the GPU)"
