"""Start a Celery worker process on the broker (``genjob worker``; test workers call it with their app).

Must not know: HTTP, the CLI's option parsing.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from celery import Celery


def run_worker(
    app: Celery, *, queue: str, concurrency: int, hostname: str, loglevel: str, extra: Sequence[str] = ()
) -> None:
    """Run ``app``'s worker until it is stopped (acks late, prefetch one chunk, no mingle)."""
    # torch and transformers load here, once, before the pool forks: a pool child that replaces
    # a crashed one is ready at once (CUDA is first touched in the child, never here).
    importlib.import_module("genjob.worker.chunks")
    argv = [
        "worker",
        f"--queues={queue}",
        f"--concurrency={concurrency}",
        "--prefetch-multiplier=1",
        f"--hostname={hostname}",
        f"--loglevel={loglevel}",
        "--without-mingle",
        *extra,
    ]
    app.worker_main(argv)
