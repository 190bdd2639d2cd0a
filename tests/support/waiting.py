"""Waiting for something to happen, within a deadline: never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")

# What a probe of a server that is not up yet raises: connection refused, reset, timed out.
NOT_UP: tuple[type[Exception], ...] = (OSError, httpx.TransportError)


def wait_for(
    probe: Callable[[], T],
    *,
    timeout: float,
    what: str,
    every: float = 0.1,
    tolerate: tuple[type[Exception], ...] = (),
) -> T:
    """Call ``probe`` every ``every`` seconds until it returns something truthy, and return that; fail
    after ``timeout`` seconds. An exception of a type in ``tolerate`` counts as not yet (``NOT_UP``: a
    server still starting); any other goes up at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except tolerate:
            value = None  # type: ignore[assignment]
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
