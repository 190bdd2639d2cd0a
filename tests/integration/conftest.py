"""Fixtures of the integration tests: real Celery worker processes, stopped after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import WorkerProcess, stop_all


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """``start(name, env, **options)`` starts a ``WorkerProcess`` logging to ``tmp_path``; every one
    stops at teardown."""
    started: list[WorkerProcess] = []

    def start(name: str, env: dict[str, str], **options: Any) -> WorkerProcess:
        worker = WorkerProcess(name, env, tmp_path / f"{name}.log", **options)
        started.append(worker)
        return worker

    yield start
    stop_all(started)
