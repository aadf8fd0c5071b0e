"""An arm's load beyond its concurrency: the request rate and burstiness of an open
loop (measure/arrivals.py draws its arrivals), read from a config and said in words.

A closed loop's ``Arm.as_config`` leaves both keys out, so that its params (and so
its runs) are what they were before open loops existed: their absence means a
closed loop and is read without the schema. An open loop's burstiness, when left
out, takes the default the schema gives it under a request_rate.
"""

from __future__ import annotations

from collections.abc import Mapping

from serving_study.config.schema import property_schema

OPEN_LOOP_KEYS = ("request_rate", "burstiness")


def open_loop_values(section: Mapping) -> dict:
    """An arm's ``request_rate`` and ``burstiness``: both None in a closed loop."""
    rate = section.get("request_rate")
    if rate is None:
        return dict.fromkeys(OPEN_LOOP_KEYS)
    burstiness = section.get("burstiness")
    if burstiness is None:
        under_a_rate = property_schema("arms")["then"]["properties"]
        burstiness = under_a_rate["burstiness"]["default"]
    return {"request_rate": float(rate), "burstiness": float(burstiness)}


def describe_load(
    concurrency: int, request_rate: float | None, burstiness: float | None
) -> str:
    """How an arm's requests come, in words (the report's tables say it)."""
    arrivals = describe_arrivals(request_rate, burstiness)
    if request_rate is None:
        return f"{arrivals}, {concurrency} in flight"
    return f"{arrivals}, at most {concurrency} in flight"


def describe_arrivals(request_rate: float | None, burstiness: float | None) -> str:
    """When an arm's requests are sent, without how many may be in flight."""
    if request_rate is None:
        return "closed loop"
    shape = "Poisson" if burstiness == 1 else f"burstiness {burstiness:g}"
    return f"{request_rate:g} req/s ({shape})"
