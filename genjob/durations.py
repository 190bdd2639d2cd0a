"""Durations as people write them: ``30s``, ``10m``, ``2h``, ``1d``, ``1h30m`` (for --expire-after)."""

from __future__ import annotations

import re
from datetime import timedelta

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
MAX_DAYS = 3660  # ten years: longer is a typo (and past what a date can hold)


def parse_duration(text: str) -> timedelta:
    """``1h30m`` → 1:30:00. Raises ValueError naming the expected form on anything else."""
    cleaned = text.strip().lower()
    parts = PART.findall(cleaned)
    if not cleaned or "".join(number + unit for number, unit in parts) != cleaned:
        raise ValueError(f"{text!r} is not a duration like 30s, 10m, 2h, 1d or 1h30m")
    seconds = sum(float(number) * UNIT_SECONDS[unit] for number, unit in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    if seconds > MAX_DAYS * UNIT_SECONDS["d"]:
        raise ValueError(f"{text!r} is too long: at most {MAX_DAYS}d")
    return timedelta(seconds=seconds)
