"""Durations as people read and type them: ``5m02s`` in tables and pages, ``7d`` on command lines."""

from __future__ import annotations

import re

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def human_seconds(value: float | None) -> str:
    """``3.2s``, ``5m02s``, ``2h10m``, ``3d4h``; ``-`` for none."""
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h"


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w``, or sums such as ``1d12h``; in seconds."""
    text = text.strip().lower()
    pos, total = 0, 0.0
    while pos < len(text):
        match = _DURATION.match(text, pos)
        if match is None:
            raise ValueError(f"{text!r} is not a duration: use seconds or a number with s, m, h, d or w (e.g. 7d)")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not text:
        raise ValueError("the duration is empty")
    return total
