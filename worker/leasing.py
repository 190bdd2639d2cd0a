"""Leases held by this worker process: who holds them (worker name/pid), and the one thread that
renews them while the process makes progress (and ends a pool process that stopped making any).

A chunk's leases are renewed only while its item loop beats (``Renewal.beat``, after each engine
round): a round must end within ``GENJOB_ROUND_STALL_S``, loading the job's models within
``GENJOB_LOAD_STALL_S``. Past that bound the chunk is *stalled*: one error line, and no more renewals,
so its items' leases run out and a sweeper queues them again, even though the process lives on (a
pool process deadlocked in C code, say torch's OpenMP pool after a fork, would otherwise hold its
items forever). Such a process never comes back by itself, so in a Celery pool process
(``end_when_stalled``) the same thread kills it (SIGKILL) once its leases have surely run out (its
last renewal or progress + ``GENJOB_LEASE_S`` + ``KILL_MARGIN_S``): Celery replaces the process and
requeues its message (acks late, reject on worker lost); the items' attempts and fences keep a late
write of the dead process from counting. A chunk that moves again before that is renewed again.
Must not know: torch, the engine, the HTTP API.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from genjob.db import run_transaction
from genjob.settings import Settings
from genjob.store import leases
from genjob.worker.metrics import note_progress

log = logging.getLogger(__name__)

KILL_MARGIN_S = 1.0  # a stalled process is killed this long after its leases ran out


def worker_name() -> str:
    return socket.gethostname()


def lease_holder(worker: str) -> str:
    """Who holds a lease: the worker's name and this process (each pool child has its own)."""
    return f"{worker}/{os.getpid()}"


@dataclass
class _Held:
    """One chunk's leases, renewed every lease_s/3 from when it was taken while its heartbeat is fresh."""

    settings: Settings
    item_ids: list[int]
    holder: str
    due: float  # time.monotonic() of its next renewal
    beat: tuple[float, float]  # (time.monotonic() of its last progress, seconds it may go without): one write
    renewed_at: float  # time.monotonic() when its leases were last extended (taken, or renewed)
    stalled: bool = False
    ended: bool = False  # its process was told to end

    @property
    def worker(self) -> str:
        return self.holder.rsplit("/", 1)[0]

    def kill_at(self) -> float:
        """When its leases have surely run out, if it makes no progress meanwhile."""
        return max(self.beat[0], self.renewed_at) + self.settings.lease_s + KILL_MARGIN_S

    def wake_at(self, *, may_end: bool) -> float:
        """Its next renewal, or, stalled in a process that may be ended, the end if sooner."""
        return min(self.due, self.kill_at()) if may_end and self.stalled and not self.ended else self.due


def _renew_in_database(held: _Held) -> None:
    run_transaction(
        held.settings.database_url,
        leases.renew_leases,
        item_ids=held.item_ids,
        worker=held.holder,
        lease_s=held.settings.lease_s,
    )


def _kill_this_process() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class LeaseRenewer:
    """This process's one daemon thread that renews the leases of the chunks it holds (``holding``),
    each every lease_s/3 while it makes progress, as a thread per chunk would, without starting and
    joining one per chunk; the watchdog of stalled chunks (see the module's doc).

    If the process dies, renewals stop and the leases run out; a renewal that fails (the database is
    away) is only logged: the next one may succeed before the lease ends. A chunk's renewal runs
    under the renewer's lock, so once ``holding`` has exited none of its renewals is in flight or to
    come: the leases a chunk ended (a graceful stop, a fault) stay ended. A forked child (a Celery
    pool process) starts its own thread at its first chunk. ``end_when_stalled`` is set in Celery's
    pool processes only: an embedded run (the CLI's own process) is never killed, only not renewed.
    """

    def __init__(
        self,
        *,
        renew: Callable[[_Held], None] = _renew_in_database,
        end_process: Callable[[], None] = _kill_this_process,
    ) -> None:
        self._renew_leases = renew
        self._end_process = end_process
        self.end_when_stalled = False
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._changed = threading.Condition()
        self._held: dict[int, _Held] = {}
        self._thread: threading.Thread | None = None

    @contextmanager
    def holding(
        self, settings: Settings, *, item_ids: Sequence[int], holder: str, allow_s: float | None = None
    ) -> Iterator[Renewal]:
        """Renew the leases of ``holder`` on ``item_ids`` while in the block (or until its ``stop()``)
        and while it beats: the first beat is due within ``allow_s`` (default GENJOB_ROUND_STALL_S)."""
        now = time.monotonic()
        allow = settings.round_stall_s if allow_s is None else allow_s
        held = _Held(settings, list(item_ids), holder, now + settings.lease_s / 3, (now, allow), now)
        with self._changed:
            self._held[id(held)] = held
            note_progress(held.worker, bound_s=allow, holding=True)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lease-renewer", daemon=True)
                self._thread.start()
            self._changed.notify()
        renewal = Renewal(self, held)
        try:
            yield renewal
        finally:
            renewal.stop()

    def _forget(self, held: _Held) -> None:
        with self._changed:  # waits for a renewal in flight
            if self._held.pop(id(held), None) is not None and not self._held:
                note_progress(held.worker, bound_s=held.beat[1], holding=False)

    def _run(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                for held in list(self._held.values()):
                    if held.due <= now or held.stalled:
                        self._check(held, now)
                may_end = self.end_when_stalled
                wake = min((held.wake_at(may_end=may_end) for held in self._held.values()), default=None)
                self._changed.wait(None if wake is None else max(0.0, wake - time.monotonic()))

    def _check(self, held: _Held, now: float) -> None:
        """Renew ``held`` if it moves; else stop renewing it, and end the process once its leases ran out."""
        beat_at, allow = held.beat
        if now - beat_at <= allow:
            if held.stalled:
                held.stalled = False
                log.warning("%s: progress again; its leases are renewed again", held.holder)
            elif held.due > now:
                return
            held.due = now + held.settings.lease_s / 3
            self._renew(held)
            return
        if held.due <= now:
            held.due = now + held.settings.lease_s / 3
        if not held.stalled:
            held.stalled = True
            log.error(
                "%s: no progress for %.0f s (bound %g s): the leases of its %d items are no longer renewed%s",
                held.holder,
                now - beat_at,
                allow,
                len(held.item_ids),
                f"; the process ends in {max(0.0, held.kill_at() - now):.0f} s unless it moves"
                if self.end_when_stalled
                else "",
            )
        if self.end_when_stalled and not held.ended and now >= held.kill_at():
            held.ended = True
            log.error(
                "%s: still no progress after %.0f s, its leases ran out: killing this pool process "
                "for Celery to replace it",
                held.holder,
                now - beat_at,
            )
            self._end_process()

    def _renew(self, held: _Held) -> None:
        try:
            self._renew_leases(held)
        except Exception as exc:
            log.warning("could not renew the leases of %s: %s", held.holder, exc)
        else:
            held.renewed_at = time.monotonic()


@dataclass
class Renewal:
    """One chunk's renewals: ``beat()`` after each round; ``stop()`` ends them (no renewal in flight
    or to come once it returns)."""

    renewer: LeaseRenewer
    held: _Held

    def beat(self, extra_s: float = 0.0) -> None:
        """Progress now: the next beat is due within GENJOB_ROUND_STALL_S (+ ``extra_s``, a known wait)."""
        held = self.held
        allow = held.settings.round_stall_s + extra_s
        held.beat = (time.monotonic(), allow)
        note_progress(held.worker, bound_s=allow)

    def stop(self) -> None:
        self.renewer._forget(self.held)
