"""Leases held by this worker process: who holds them (worker name/pid), and the thread renewing them.

Must not know: torch, the engine, the HTTP API.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Sequence

from genjob.db import run_transaction
from genjob.settings import Settings
from genjob.store import leases

log = logging.getLogger(__name__)


def worker_name() -> str:
    return socket.gethostname()


def lease_holder(worker: str) -> str:
    """Who holds a lease: the worker's name and this process (each pool child has its own)."""
    return f"{worker}/{os.getpid()}"


class LeaseKeeper:
    """A daemon thread that renews this process's leases on a chunk's items every lease_s/3.

    If the process dies, renewals stop and the leases run out; a renewal that fails (the
    database is away) is only logged: the next one may succeed before the lease ends.
    """

    def __init__(self, settings: Settings, *, item_ids: Sequence[int], holder: str) -> None:
        self.settings, self.item_ids, self.holder = settings, list(item_ids), holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{holder}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.lease_s / 3):
            try:
                run_transaction(
                    self.settings.database_url,
                    leases.renew_leases,
                    item_ids=self.item_ids,
                    worker=self.holder,
                    lease_s=self.settings.lease_s,
                )
            except Exception as exc:
                log.warning("could not renew the leases of %s: %s", self.holder, exc)
