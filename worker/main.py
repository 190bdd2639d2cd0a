"""Start a Celery worker process on the broker (``genjob worker``; test workers call it with their app).

What may happen in the worker's main process before Celery forks its pool, and what may not:
  - may: import torch, transformers and the worker's modules (so that a pool child that replaces a
    crashed one is ready at once), read settings, talk to the database and the broker, serve metrics;
  - may not: run any torch operation or create a CUDA context. torch's OpenMP thread pool does not
    survive ``fork`` (a child's first multi-threaded op then blocks forever), and CUDA refuses a child
    forked after it started. The device check runs in a process of its own (``device_probe.probe_device``);
    each pool child sets its torch threads (``pool_threads``) and first touches the device itself.
``assert_fork_safe`` checks what it can (CUDA) just before the fork; tests/worker/test_fork_rules.py
holds the rest (no torch function runs in the main process before the fork).
Must not know: HTTP, the CLI's option parsing.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Sequence

from celery import Celery
from celery.signals import worker_ready

from genjob.settings import Settings

log = logging.getLogger(__name__)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def pool_threads(settings: Settings, concurrency: int) -> int:
    """torch threads per pool process: GENJOB_TORCH_THREADS, else the usable cores ÷ concurrency."""
    return settings.torch_threads or max(1, usable_cores() // max(1, concurrency))


def assert_fork_safe() -> None:
    """Raise if this process created a CUDA context: every pool child forked from it would fail."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised in the worker's main process before its pool forked")


def run_worker(
    app: Celery,
    *,
    queue: str,
    concurrency: int,
    hostname: str,
    loglevel: str,
    extra: Sequence[str] = (),
    devices: Sequence[str] | None = None,
) -> None:
    """Run ``app``'s worker until it is stopped (acks late, prefetch one chunk, no mingle). ``devices``:
    each pool process's device by index (``genjob.worker.devices.pool_devices``); None: the setting's."""
    importlib.import_module("genjob.worker.chunks")  # torch and transformers: imported, nothing run
    settings: Settings = app.genjob_settings
    app.conf.worker_concurrency = concurrency  # the pool children read it (``pool_threads``)
    app.genjob_pool_devices = list(devices) if devices else None  # each child takes its own
    threads = pool_threads(settings, concurrency)
    why = "GENJOB_TORCH_THREADS" if settings.torch_threads else f"{usable_cores()} cores ÷ {concurrency}"

    def announce(**_kwargs: object) -> None:
        log.info("torch threads per pool process: %d (%s)", threads, why)

    worker_ready.connect(announce, weak=False)
    assert_fork_safe()
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
