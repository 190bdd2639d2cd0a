"""Leases held by this worker process: who holds them (worker name/pid), and the one thread renewing them.

Must not know: torch, the engine, the HTTP API.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from genjob.db import run_transaction
from genjob.settings import Settings
from genjob.store import leases

log = logging.getLogger(__name__)


def worker_name() -> str:
    return socket.gethostname()


def lease_holder(worker: str) -> str:
    """Who holds a lease: the worker's name and this process (each pool child has its own)."""
    return f"{worker}/{os.getpid()}"


@dataclass
class _Held:
    """One chunk's leases, renewed every lease_s/3 from when it was taken."""

    settings: Settings
    item_ids: list[int]
    holder: str
    due: float  # time.monotonic() of its next renewal


class LeaseRenewer:
    """This process's one daemon thread that renews the leases of the chunks it holds (``holding``),
    each every lease_s/3, as a thread per chunk would, without starting and joining one per chunk.

    If the process dies, renewals stop and the leases run out; a renewal that fails (the database is
    away) is only logged: the next one may succeed before the lease ends. A chunk's renewal runs
    under the renewer's lock, so once ``holding`` has exited none of its renewals is in flight or to
    come: the leases a chunk ended (a graceful stop, a fault) stay ended. A forked child (a Celery
    pool process) starts its own thread at its first chunk.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._changed = threading.Condition()
        self._held: dict[int, _Held] = {}
        self._thread: threading.Thread | None = None

    @contextmanager
    def holding(self, settings: Settings, *, item_ids: Sequence[int], holder: str) -> Iterator[Renewal]:
        """Renew the leases of ``holder`` on ``item_ids`` while in the block (or until its ``stop()``)."""
        held = _Held(settings, list(item_ids), holder, time.monotonic() + settings.lease_s / 3)
        with self._changed:
            self._held[id(held)] = held
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lease-renewer", daemon=True)
                self._thread.start()
            self._changed.notify()
        renewal = Renewal(self, id(held))
        try:
            yield renewal
        finally:
            renewal.stop()

    def _forget(self, key: int) -> None:
        with self._changed:  # waits for a renewal in flight
            self._held.pop(key, None)

    def _run(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                for held in [held for held in self._held.values() if held.due <= now]:
                    held.due = now + held.settings.lease_s / 3
                    self._renew(held)
                next_due = min((held.due for held in self._held.values()), default=None)
                self._changed.wait(None if next_due is None else max(0.0, next_due - time.monotonic()))

    @staticmethod
    def _renew(held: _Held) -> None:
        try:
            run_transaction(
                held.settings.database_url,
                leases.renew_leases,
                item_ids=held.item_ids,
                worker=held.holder,
                lease_s=held.settings.lease_s,
            )
        except Exception as exc:
            log.warning("could not renew the leases of %s: %s", held.holder, exc)


@dataclass
class Renewal:
    """One chunk's renewals: ``stop()`` ends them (no renewal in flight or to come once it returns)."""

    renewer: LeaseRenewer
    key: int

    def stop(self) -> None:
        self.renewer._forget(self.key)


RENEWER = LeaseRenewer()
