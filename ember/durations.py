"""Time budgets as people write them: '90s', '20m', '1.5h' in, '1h02m' out."""

from __future__ import annotations

import re

from ember.errors import EmberError


def parse_duration(text: str | float) -> float:
    """'90', '90s', '20m', '1.5h' -> seconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(text))
    if not match:
        raise EmberError(f"cannot read duration {text!r}; write e.g. 90s, 20m or 1.5h")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"s": 1, "m": 60, "h": 3600}[unit]


def duration_arg(text: str) -> float:
    """``parse_duration`` as an argparse ``type=``: a bad value is argparse's usage error
    ("ember pretrain: error: argument --max-time: cannot read duration ..."), not a traceback."""
    import argparse

    try:
        return parse_duration(text)
    except EmberError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_duration(seconds: float) -> str:
    """3725 -> '1h02m', 1200 -> '20m', 90 -> '1m30s', 4 -> '4s'."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m" + (f"{seconds % 60:02d}s" if seconds % 60 else "")
    return f"{seconds}s"
