"""The deadline of a warm shutdown: on SIGTERM the worker is gone within GENJOB_STOP_GRACE_S + margin.

Celery's warm shutdown (SIGTERM, or a first Ctrl-C, to the worker's main process) waits for the chunks
in flight to end, and the item loop ends its chunk within ``GENJOB_STOP_GRACE_S`` (the stop flag,
``genjob.worker.stopping``) unless its pool process never looks (stuck in C code, say, or loading a model).
So the main process gives its pool processes until ``GENJOB_STOP_GRACE_S`` + ``STOP_MARGIN_S`` (the
margin covers giving the rest back and closing the chunk); then it kills (SIGKILL) each one still
alive, ends the leases it held (``genjob.store.leases.give_up_leases`` of ``worker/pid``: a sweeper queues
its items again at its next sweep, not a lease later) and, if Celery has still not exited
``EXIT_AFTER_S`` later, ends the process itself (exit 1). A killed process's late writes cannot count:
the items' fences moved on. Runs in the main process only; a pool process's own SIGTERM only raises
the stop flag. Must not know: torch, the engine, HTTP, the CLI.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

from genjob.db import run_transaction
from genjob.store import leases

log = logging.getLogger(__name__)

STOP_MARGIN_S = 5.0
EXIT_AFTER_S = 5.0
END_LEASES_RETRY_S = 5.0

_WORKERS: list[Any] = []  # the Celery WorkController of this (main) process, once it exists
_DEADLINE: list[threading.Thread] = []  # at most one, started by the first warm shutdown


def install_stop_deadline() -> None:
    """Wire the deadline to Celery's worker signals (once per process, whatever the number of apps)."""
    from celery.signals import worker_init, worker_shutting_down

    worker_init.connect(_remember_worker, weak=False, dispatch_uid="genjob-stop-deadline-init")
    worker_shutting_down.connect(_on_shutting_down, weak=False, dispatch_uid="genjob-stop-deadline")


def _remember_worker(sender: Any = None, **_kwargs: Any) -> None:
    _WORKERS[:] = [sender]


def _on_shutting_down(sender: Any = None, how: str = "Warm", **_kwargs: Any) -> None:
    """In the main process's signal handler: start the deadline's thread (at the first warm shutdown)."""
    if how != "Warm" or not _WORKERS or _DEADLINE:
        return
    worker = _WORKERS[0]
    settings = getattr(worker.app, "genjob_settings", None)
    if settings is None or settings.embedded:
        return
    deadline = time.monotonic() + settings.stop_grace_s + STOP_MARGIN_S
    thread = threading.Thread(
        target=enforce_deadline,
        args=(worker.hostname, settings.database_url, deadline),
        name="genjob-stop-deadline",
        daemon=True,
    )
    _DEADLINE.append(thread)
    thread.start()


def pool_processes() -> list[int]:
    """The pids of this process's pool processes alive now (billiard's children: Celery's prefork pool)."""
    from billiard.process import active_children  # type: ignore[import-untyped]

    return [child.pid for child in active_children() if child.pid is not None]


def kill_and_end_leases(hostname: str, database_url: str, pids: list[int]) -> int:
    """SIGKILL ``pids`` (pool processes of worker ``hostname``) and end the leases they held; returns
    how many leases it ended."""
    ended = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # it stopped by itself meanwhile
            os.kill(pid, signal.SIGKILL)
        holder = f"{hostname}/{pid}"
        try:
            count = run_transaction(
                database_url, leases.give_up_leases, worker=holder, retry_s=END_LEASES_RETRY_S
            )
        except Exception as exc:  # its leases run out by themselves
            log.error("could not end the leases of %s: %s", holder, exc)
            continue
        ended += count
        log.error("worker: pool process %d had not stopped: killed; its leases on %d items ended", pid, count)
    return ended


def enforce_deadline(hostname: str, database_url: str, deadline: float) -> None:
    """The deadline's thread: wait until ``deadline``; kill what is left of the pool, end its leases, exit."""
    time.sleep(max(0.0, deadline - time.monotonic()))
    pids = pool_processes()
    if not pids:
        return
    log.error("worker: %d pool processes still running at the stop deadline; killing them", len(pids))
    kill_and_end_leases(hostname, database_url, pids)
    time.sleep(EXIT_AFTER_S)
    log.error("worker: still not stopped %g s after killing its pool: exiting", EXIT_AFTER_S)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(1)
