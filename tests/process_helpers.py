"""Start real service processes (`genjob worker`, `genjob flower`, `genjob api`) for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import httpx
from conftest import COST_CACHE_DIR, REDIS_URL

GENJOB = str(Path(sys.executable).with_name("genjob"))
T = TypeVar("T")


def service_env(pg_url: str, queue: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GENJOB_", "FLOWER_"))}
    env.update(
        GENJOB_DATABASE_URL=pg_url,
        GENJOB_BROKER_URL=REDIS_URL,
        GENJOB_QUEUE=queue,
        GENJOB_TORCH_THREADS="1",
        GENJOB_COST_CACHE_DIR=str(COST_CACHE_DIR),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running(argv: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen]:
    """A process (group) running for the block, its output in ``log_path``; terminated after."""
    with log_path.open("w") as log:
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield process
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def wait_for(probe: Callable[[], T | None], *, timeout: float, what: str, every: float = 0.5) -> T:
    """Call ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except (OSError, httpx.TransportError):  # not up yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
