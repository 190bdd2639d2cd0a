"""Fixtures of the integration tests: real Celery worker processes, stopped after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_processes import WorkerProcess


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator:
    """``start(name, env)`` starts a worker process logging to ``tmp_path``; every one stops at teardown."""
    started: list[WorkerProcess] = []

    def start(name: str, env: dict[str, str]) -> WorkerProcess:
        worker = WorkerProcess(name, env, tmp_path / f"{name}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
