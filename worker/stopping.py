"""The worker's graceful stop: one flag, raised by SIGTERM, read by the item loop.

On SIGTERM (to the main process: Celery's warm shutdown; or to a pool process, as ``kill`` of the
process group sends it) ``STOP`` is raised in memory shared by the main process and its forked pool
processes; the item loop (``genjob.worker.item_loop``) then claims nothing more, lets the rows in
flight finish for ``GENJOB_STOP_GRACE_S`` and gives back the rest at once (leases ended, their tries
not counted). Must not know: the database, HTTP, the CLI, torch.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
from typing import Any

# Created at import, in the main process, before the pool forks: its children share it.
STOP = multiprocessing.RawValue(ctypes.c_bool, False)


def stopping() -> bool:
    return bool(STOP.value)


def request_stop(*_args: Any) -> None:
    STOP.value = True


_TERMS_HERE: list[int] = []  # SIGTERMs this process received (the shared flag may be set by another)


def _on_sigterm_in_pool(signum: int, frame: Any) -> None:
    """First SIGTERM: stop claiming and give back what is held. A second one ends the process."""
    _TERMS_HERE.append(signum)
    if len(_TERMS_HERE) > 1:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    request_stop()


def catch_sigterm_in_pool() -> None:
    """In a pool process, before it runs a chunk: SIGTERM raises the stop flag (billiard sets its own
    handler, which exits at once, after the process initialisers, so this is done from the task)."""
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm_in_pool:
        signal.signal(signal.SIGTERM, _on_sigterm_in_pool)


def install_stop_handlers() -> None:
    """Wire the stop flag to Celery's warm shutdown in the main process."""
    from celery.signals import worker_shutting_down

    def on_shutting_down(**_kwargs: Any) -> None:
        request_stop()

    worker_shutting_down.connect(on_shutting_down, weak=False)
