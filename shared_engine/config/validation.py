"""Small checks shared by the config dataclasses; every message names the field and the allowed range."""

from __future__ import annotations


def check_range(name: str, value, low=None, high=None, *, low_open: bool = False, allow_none: bool = False):
    """Raise `ValueError` unless `low <= value <= high` (`low < value` when `low_open`)."""
    if value is None:
        if allow_none:
            return
        raise ValueError(f"{name} must be set")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        raise ValueError(f"{name} must be {_describe(low, high, low_open)}, got {value}")


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")


def _describe(low, high, low_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"> {low}" if low_open else f">= {low}")
    if high is not None:
        parts.append(f"<= {high}")
    return " and ".join(parts)
