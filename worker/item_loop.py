"""The one item loop: a chunk's items through the engine, claimed as rows free up, written in groups.

Every job, every batch size (1 included), every mode runs here. Items are claimed a group at a time
(one UPDATE … RETURNING: an attempt each, fenced) as the engine frees rows for them (at least a
quarter of the batch, or all it has when it runs dry), then decoded in the batch; the rows that
finished are written with the next claim (``ChunkStore.write_and_claim``: one statement on Postgres,
the last group's with the chunk's close), so the bookkeeping costs a round trip per group, not per
item. Sampled greedy items of a speculative job also get a twin row decoded without drafts (the
lossless check).

Faults: an item whose prompt cannot be decoded here (too long for the context) fails alone. If a
round raises, the batch is lost: its items go back (their try counted) and run one at a time after
the rest, with the usual bounded retries, so a poison item fails alone and its batch-mates finish;
a sticky device error is no batch's fault (``genjob.worker.devices``): it goes up, a worker fault.
Cancel and expiry are checked at every claim and about once a second: no new item is claimed after
them, the rows that finished are kept, and the rows in flight leave the batch at once (their items
end ``cancelled`` or ``expired``, as their job). On a graceful stop (SIGTERM,
``genjob.worker.stopping``) nothing more is claimed, the rows in flight get ``GENJOB_STOP_GRACE_S``
to finish, and the rest are given back at once (their tries not counted). After each engine round
the loop beats (``ChunkContext.beat``): the chunk's leases are renewed only while it does.
Must not know: HTTP, the CLI.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass, field

from genjob import store
from genjob.constants import AttemptOutcome
from genjob.generation.requests import Finished
from genjob.settings import Settings
from genjob.store.chunks import Rows
from genjob.store.claims import ClaimedItem
from genjob.worker.chunk_context import ChunkContext, ChunkOutcome, Runner
from genjob.worker.devices import is_sticky_device_error
from genjob.worker.runners import result_row
from genjob.worker.stopping import stopping

log = logging.getLogger(__name__)

MAX_RETRY_BACKOFF_S = 60.0
JOB_CHECK_EVERY_S = 1.0
WRITE_EVERY_S = 1.0  # finished rows wait at most this long for the next claim's transaction
DROPPED = "job %s item %s: finished after its lease was taken over; result dropped"


def retry_delay(settings: Settings, attempts: int) -> float:
    """Backoff before try ``attempts + 1``: retry_backoff_s, then doubling, at most a minute."""
    return min(settings.retry_backoff_s * 2 ** (attempts - 1), MAX_RETRY_BACKOFF_S)


@dataclass
class ItemLoop:
    runner: Runner
    context: ChunkContext
    outcome: ChunkOutcome
    in_flight: dict[int, ClaimedItem] = field(default_factory=dict)
    twins: dict[int, Finished | None] = field(default_factory=dict)  # item id -> its plain twin, once done
    held: dict[int, Finished] = field(default_factory=dict)  # items done, waiting for their twin
    alone: list[int] = field(default_factory=list)  # items of a lost batch, to run one at a time
    finished: Rows = field(default_factory=list)  # to write
    failed: list[tuple[ClaimedItem, str]] = field(default_factory=list)  # to write
    claimed: set[int] = field(default_factory=set)  # every item this chunk claimed
    proposer_counts: Counter[str] = field(default_factory=Counter)  # mode auto: the chunk's, summed
    written_at: float = field(default_factory=time.monotonic)
    stop_seen: float | None = None

    def run(self, item_ids: list[int], *, keep_last: bool = False) -> None:
        """``keep_last``: the last group's results are left in ``finished``, for the chunk's close.
        However it ends, the runner's K/V caches are released: a finished job keeps no memory."""
        engine = self.runner.engine
        engine.max_rows = max(1, min(self.runner.batch_size, len(item_ids)))
        try:
            self._batched(deque(item_ids))
            if not keep_last or self.failed or self.alone:
                self._write()
            if self.alone:
                engine.max_rows = 1
                for item_id in self.alone:
                    if self.outcome.stopped or not self._single(item_id):
                        self.outcome.stopped = True
                        break
        finally:
            self.runner.release()

    # --- writing and claiming, one transaction ----------------------------------------------------------
    def _sync(self, claim: list[int]) -> list[ClaimedItem]:
        """Write what finished; claim ``claim`` (the items the job still has and that nobody else holds)."""
        finished, failed = self.finished, self.failed
        self.finished, self.failed, self.written_at = [], [], time.monotonic()
        if not (finished or failed or claim):
            return []
        done, gone, claimed = self.context.chunks.write_and_claim(
            finished=finished, failed=failed, claim=claim
        )
        self.written(finished, done, gone)
        if claimed is store.Refused.JOB_ENDED:
            self.outcome.stopped = True
            self.outcome.skipped += len(claim)
            return []
        assert isinstance(claimed, list)
        self.outcome.skipped += len(claim) - len(claimed)
        self.claimed.update(item.id for item in claimed)
        return claimed

    def written(self, finished: Rows, done: set[int], gone: set[int]) -> None:
        """Count a write's ``done`` and ``gone`` items; the rest of ``finished`` lost their lease."""
        self.outcome.done += len(done)
        self.outcome.failed += len(gone)
        for item, _ in finished:
            if item.id not in done:
                log.warning(DROPPED, item.job_id, item.seq)

    def _write(self) -> None:  # what finished, without a claim
        self._sync([])

    def _due_for_writing(self, todo: deque[int]) -> bool:
        pending = len(self.finished) + len(self.failed)
        if not pending:
            return False
        return not todo or pending >= self._room() or time.monotonic() - self.written_at > WRITE_EVERY_S

    # --- the batched loop ------------------------------------------------------------------------------
    def _room(self) -> int:
        """Rows the batch can hold now: its size, or fewer (the K/V budget, an out-of-memory error)."""
        engine = self.runner.engine
        return engine.busy + engine.free_rows

    def _batched(self, todo: deque[int]) -> None:
        engine = self.runner.engine
        checked = time.monotonic()
        while todo or engine.busy:
            if stopping() and self._stop_now(todo):
                return
            if (todo or engine.busy) and time.monotonic() - checked > JOB_CHECK_EVERY_S:
                checked = time.monotonic()
                if self.context.chunks.job_ended():
                    self.outcome.stopped = True
                    self._stop_in_flight()
            if self.outcome.stopped:
                self.outcome.skipped += len(todo)
                todo.clear()
            want = min(engine.free_rows, len(todo))
            refill = min(max(1, self._room() // 4), len(todo))
            if want and (want >= refill or not engine.busy):
                for item in self._sync([todo.popleft() for _ in range(want)]):
                    self._admit(item)
            elif self._due_for_writing(todo):
                self._write()
            if not engine.busy:
                continue
            try:
                finished = engine.step()
            except Exception as exc:  # the batch is lost: its items go back, to be run one by one
                if is_sticky_device_error(exc):
                    raise  # not the batch's fault: every later round would fail too (a worker fault)
                self._lose_batch(exc)
                continue
            self.context.beat()  # a round ended: the chunk moves, its leases are renewed
            for done in finished:
                self._finished(done)

    def _stop_now(self, todo: deque[int]) -> bool:
        """A graceful stop: claim nothing more; give the rows in flight until the grace ends."""
        now = time.monotonic()
        if self.stop_seen is None:
            self.stop_seen = now
            log.warning(
                "job %s: stopping (SIGTERM): %d items in flight get %g s to finish, %d unstarted go back",
                self.context.job_id,
                len(self.in_flight),
                self.context.settings.stop_grace_s,
                len(todo),
            )
        self.outcome.stopped = self.outcome.interrupted = True
        todo.clear()
        if self.runner.engine.busy and now - self.stop_seen < self.context.settings.stop_grace_s:
            return False
        self._give_back()
        return True

    def _drop_in_flight(self) -> list[ClaimedItem]:
        """The rows in flight leave the batch at once (their twins and held halves too): their items,
        for the caller to hand back or stop."""
        self.runner.engine.abandon()
        items = list(self.in_flight.values())
        self.in_flight.clear()
        self.twins.clear()
        self.held.clear()
        return items

    def _hand_back(
        self,
        items: list[ClaimedItem],
        *,
        error: str | None,
        outcome: AttemptOutcome,
        refund: bool = False,
        expire_lease: bool = False,
    ) -> None:
        """Give ``items`` back to the job (``genjob.store.release_items``)."""
        if items:
            self.context.tx(
                store.release_items,
                items=items,
                worker=self.context.holder,
                error=error,
                outcome=outcome,
                refund=refund,
                expire_lease=expire_lease,
            )

    def _give_back(self) -> None:
        """Hand the items in flight back at once (their leases end now, their tries are refunded)."""
        self._write()
        items = self._drop_in_flight()
        self.context.stop_renewals()
        self._hand_back(items, error=None, outcome=AttemptOutcome.RELEASED, refund=True, expire_lease=True)

    def _stop_in_flight(self) -> None:
        """The job was cancelled or expired: what finished is written and kept; the rows in flight
        leave the batch at once and end as their job did (``genjob.store.stop_items``)."""
        self._write()
        if not self.in_flight:
            return
        stopped = self.context.tx(store.stop_items, items=self._drop_in_flight(), worker=self.context.holder)
        self.outcome.skipped += len(stopped)
        log.info("job %s: ended; %d rows in flight stopped", self.context.job_id, len(stopped))

    def give_up_in_flight(self, error: str) -> set[int]:
        """After a fault of this worker: write what finished, hand back the items in flight, their
        tries counted (``lost``) and their leases ended now, for a sweeper to queue them again."""
        try:
            self._write()
        except Exception as exc:  # the items stay running: they are reclaimed once their lease ends
            log.warning("job %s: could not write finished rows: %s", self.context.job_id, exc)
            return set(self.in_flight)
        items = self._drop_in_flight()
        self._hand_back(items, error=error, outcome=AttemptOutcome.LOST, expire_lease=True)
        return {item.id for item in items}

    def _admit(self, item: ClaimedItem) -> None:
        engine = self.runner.engine
        try:
            requests = [self.runner.request(item)]
            if self.runner.is_lossless_sample(item.seq) and not item.temperature:
                requests.append(self.runner.request(item, key=-item.id, plain=True))
                self.twins[item.id] = None
            engine.add(requests)
        except Exception as exc:  # PromptTooLong, an empty prompt: no other try can help
            self.twins.pop(item.id, None)
            self._fail(item, exc)
            return
        self.in_flight[item.id] = item

    def _finished(self, done: Finished) -> None:
        if done.key < 0:  # a plain twin
            self.twins[-done.key] = done
            item_done = self.held.pop(-done.key, None)
            if item_done is not None:
                self._record(item_done)
            return
        if done.key in self.twins and self.twins[done.key] is None:
            self.held[done.key] = done  # wait for its twin
            return
        self._record(done)

    def _record(self, done: Finished) -> None:
        item = self.in_flight.pop(done.key)
        twin = self.twins.pop(done.key, None)
        lossless = None if twin is None else twin.token_ids == done.token_ids
        if twin is not None:  # the check's cost is the item's: its latency carries the twin's share
            done.stats.latency_s += twin.stats.latency_s
        if lossless is False:
            log.warning(
                "item %s: speculative output differs from plain: %s vs %s",
                item.seq,
                done.token_ids,
                twin.token_ids if twin else None,
            )
        row = result_row(self.runner, done, self.context.worker, lossless, item.stop)
        self.proposer_counts.update(row.get("proposer_counts") or {})
        self.runner.learn(done)  # its output joins what the job's later rows may draft from
        self.finished.append((item, row))

    def _lose_batch(self, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        log.warning(
            "job %s: a batch failed (%s); its %d items run alone\n%s",
            self.context.job_id,
            error,
            len(self.in_flight),
            traceback.format_exc(),
        )
        items = self._drop_in_flight()
        max_attempts = self.context.settings.max_attempts
        for item in items:
            if item.attempts >= max_attempts:  # no try left to run it alone
                self._fail(item, exc)
        self._write()
        again = [item for item in items if item.attempts < max_attempts]
        self._hand_back(again, error=error, outcome=AttemptOutcome.RETRIED)
        self.alone.extend(item.id for item in again)

    def _fail(self, item: ClaimedItem, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if item.attempts > 1:
            error += f" (attempt {item.attempts} of {self.context.settings.max_attempts})"
        log.warning("job %s item %s failed: %s", item.job_id, item.seq, error)
        self.failed.append((item, error))

    # --- one item alone, retried with backoff -----------------------------------------------------------
    def _single(self, item_id: int) -> bool:
        """Claim, decode and record one item, trying again after an error; False: stop the chunk."""
        settings, engine = self.context.settings, self.runner.engine
        while True:
            if stopping():
                self.outcome.interrupted = True
                return False
            claimed = self._sync([item_id])
            if self.outcome.stopped:
                return False
            if not claimed:  # final, or held by another
                return True
            item = claimed[0]
            self._admit(item)
            if item_id not in self.in_flight:  # failed at once
                self._write()
                return True
            try:
                while engine.busy:
                    for done in engine.step():
                        self._finished(done)
                    self.context.beat()
                self._write()
                return True
            except Exception as exc:
                if is_sticky_device_error(exc):
                    raise  # a worker fault: the item goes back with the rest (``ChunkRun.give_back``)
                self._drop_in_flight()  # the item alone
                if item.attempts >= settings.max_attempts:
                    log.warning("%s", traceback.format_exc())
                    self._fail(item, exc)
                    self._write()
                    return True
                delay = retry_delay(settings, item.attempts)
                error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "job %s item %s: %s; try %d in %.1f s",
                    item.job_id,
                    item.seq,
                    error,
                    item.attempts + 1,
                    delay,
                )
                self._hand_back([item], error=error, outcome=AttemptOutcome.RETRIED)
                self.outcome.retried += 1
                self.context.beat(delay)  # the backoff is no stall
                time.sleep(delay)
