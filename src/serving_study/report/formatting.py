"""How the report writes a value in a cell: text, a config value, a ratio, a
median with its spread, a figure's heading."""

import json
import math

from serving_study.analysis.numbers import format_number, is_number
from serving_study.metric_catalogue import METRICS


def text(value) -> str:
    """A cell's text: empty for missing values, whole numbers without '.0'."""
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value.is_integer():
            return str(int(value))
    return str(value)


def describe(value) -> str:
    """A config or host value as text; nested values as compact JSON."""
    if value is None:
        return "none"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return text(value)


def ratio_text(value) -> str:
    return f"{value:.3g}x" if is_number(value) else "–"


def summary_text(summary) -> str:
    if not is_number(summary["median"]):
        return "–"
    median = format_number(summary["median"])
    spread = f"[{format_number(summary['min'])}–{format_number(summary['max'])}]"
    interval = interval_text(summary)
    return f"{median} {spread}" + (f", 95% CI {interval}" if interval else "")


def interval_text(summary) -> str:
    if not is_number(summary["ci_low"]):
        return ""
    return f"{format_number(summary['ci_low'])}–{format_number(summary['ci_high'])}"


def metric_heading(metric: str) -> str:
    """A figure's name with its unit, as a column or axis heading."""
    info = METRICS[metric]
    return f"{info.label} ({info.unit})"
