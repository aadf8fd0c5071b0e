"""How a figure is written wherever people read it: in a claim's verdict and on
the report page alike, so that the two never disagree on a number."""

import math


def format_number(value) -> str:
    """A figure as people read it: thousands separators, about 3 digits."""
    if not is_number(value):
        return "–"
    value = float(value)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def is_number(value) -> bool:
    if value is None or isinstance(value, str | bool):
        return False
    try:
        return not math.isnan(float(value))
    except (TypeError, ValueError):
        return False
