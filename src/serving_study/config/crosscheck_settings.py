"""The client cross-check's settings (the config's ``client_crosscheck``): our
client against SGLang's bench_serving on one arm."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from serving_study.config.record_fields import (
    config_values,
    field_names,
    given,
    plain_fields,
)
from serving_study.config.records import Arm


@dataclass(frozen=True)
class ClientCrosscheck:
    """Our client against SGLang's bench_serving (the config's
    ``client_crosscheck``): the arm both clients run, how many pairs of runs, the
    measured requests of each run (None: the arm's) and how close the two
    throughputs must be."""

    arm: str
    pairs: int
    requests: int | None
    tolerance: float

    @classmethod
    def from_config(cls, section: Mapping) -> ClientCrosscheck:
        values = config_values(section, field_names(cls), "client_crosscheck")
        requests = values["requests"]
        return cls(
            **plain_fields(cls, values),
            requests=None if requests is None else int(requests),
        )

    def as_config(self) -> dict:
        return given(dataclasses.asdict(self))

    def measured_requests(self, arm: Arm) -> int:
        return self.requests or arm.requests
