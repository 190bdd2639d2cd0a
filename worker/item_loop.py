"""The one item loop: a chunk's items through the engine, claimed as rows free up, written as they end.

Every job, every batch size (1 included), every mode runs here. Each item is claimed (an attempt,
fenced) when the engine has a free row for it, then decoded in the batch; the rows that finish are
written at once. Sampled greedy items of a speculative job also get a twin row decoded without
drafts; the item's result records whether both agree (the lossless check).

Faults: an item whose prompt cannot be decoded here (too long for the context) fails alone. If a
round raises, the batch is lost: its items go back (their try counted) and run one at a time after
the rest, with the usual bounded retries, so a poison item fails alone and its batch-mates finish.
Cancel and expiry are checked about once a second: no new item is claimed after them; the rows in
flight finish and are kept. Must not know: HTTP, the CLI.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from genjob import store
from genjob.constants import TERMINAL_JOB_STATUSES
from genjob.generation.requests import Finished
from genjob.settings import Settings
from genjob.tables import Item, Job
from genjob.worker.runners import PERMANENT_ITEM_ERRORS, JobRunner, cut_at_stop

log = logging.getLogger(__name__)

MAX_RETRY_BACKOFF_S = 60.0
JOB_CHECK_EVERY_S = 1.0


@dataclass
class ChunkOutcome:
    done: int = 0
    failed: int = 0
    skipped: int = 0
    retried: int = 0
    stopped: bool = False


@dataclass(frozen=True)
class ChunkContext:
    settings: Settings
    job_id: str
    holder: str  # the lease holder: worker name / pid
    worker: str
    tx: Callable[..., Any]


def retry_delay(settings: Settings, attempts: int) -> float:
    """Backoff before try ``attempts + 1``: retry_backoff_s, then doubling, at most a minute."""
    return min(settings.retry_backoff_s * 2 ** (attempts - 1), MAX_RETRY_BACKOFF_S)


def _job_ended(session: Session, *, job_id: str) -> bool:
    return session.scalar(select(Job.status).where(Job.id == job_id)) in TERMINAL_JOB_STATUSES


def result_row(
    runner: JobRunner, done: Finished, worker: str, lossless: bool | None, stop: list[str] | None = None
) -> dict[str, Any]:
    stats = done.stats
    return {
        "output": cut_at_stop(runner.text(done.token_ids), stop),
        "finish_reason": stats.finish_reason,
        "mode": runner.spec.mode.value,
        "prompt_tokens": stats.prompt_tokens,
        "new_tokens": stats.new_tokens,
        "target_rounds": stats.rounds,
        "draft_proposed": stats.proposed,
        "draft_accepted": stats.accepted,
        "draft_rejections": stats.rejections,
        "gamma_mean": round(stats.mean_gamma, 4),
        "latency_s": stats.latency_s,
        "lossless_match": lossless,
        "worker": worker,
    }


@dataclass
class ItemLoop:
    runner: JobRunner
    context: ChunkContext
    outcome: ChunkOutcome
    in_flight: dict[int, tuple[Item, int]] = field(default_factory=dict)  # item id -> (item, attempt)
    twins: dict[int, Finished | None] = field(default_factory=dict)  # item id -> its plain twin, once done
    held: dict[int, Finished] = field(default_factory=dict)  # items done, waiting for their twin
    alone: list[int] = field(default_factory=list)  # items of a lost batch, to run one at a time

    def run(self, item_ids: list[int]) -> None:
        engine = self.runner.engine
        engine.max_rows = max(1, min(self.runner.batch_size, len(item_ids)))
        self._batched(deque(item_ids))
        if self.alone:
            engine.max_rows = 1
            for item_id in self.alone:
                if self.outcome.stopped or not self._single(item_id):
                    self.outcome.stopped = True
                    break
        self.runner.batch_size = min(self.runner.batch_size, max(engine.max_rows, 1))

    # --- the batched loop ------------------------------------------------------------------------------
    def _batched(self, todo: deque[int]) -> None:
        engine, tx, job_id = self.runner.engine, self.context.tx, self.context.job_id
        checked = time.monotonic()
        while todo or engine.busy:
            if todo and time.monotonic() - checked > JOB_CHECK_EVERY_S:
                checked = time.monotonic()
                if tx(_job_ended, job_id=job_id):
                    self.outcome.stopped = True
                    todo.clear()
            while todo and engine.free_rows and not self.outcome.stopped:
                self._admit(todo.popleft())
            if not engine.busy:
                continue
            try:
                finished = engine.step()
            except Exception as exc:  # the batch is lost: its items go back, to be run one by one
                self._lose_batch(exc)
                continue
            for done in finished:
                self._finished(done)

    def _admit(self, item_id: int) -> None:
        engine, settings = self.runner.engine, self.context.settings
        claimed = self.context.tx(
            store.claim_item,
            item_id=item_id,
            worker=self.context.holder,
            lease_s=settings.lease_s,
            max_attempts=settings.max_attempts,
        )
        if claimed is store.Refused.JOB_ENDED:
            self.outcome.stopped = True
            return
        if isinstance(claimed, store.Refused):
            self.outcome.skipped += 1
            return
        item, attempt_id = claimed
        try:
            requests = [self.runner.request(item)]
            if self.runner.is_lossless_sample(item.seq) and not item.temperature:
                requests.append(self.runner.request(item, key=-item.id, plain=True))
                self.twins[item.id] = None
            engine.add(requests)
        except Exception as exc:  # PromptTooLong, an empty prompt: no other try can help
            self.twins.pop(item.id, None)
            self._fail(item, attempt_id, exc)
            return
        self.in_flight[item.id] = (item, attempt_id)

    def _finished(self, done: Finished) -> None:
        if done.key < 0:  # a plain twin
            self.twins[-done.key] = done
            item_done = self.held.pop(-done.key, None)
            if item_done is not None:
                self._write(item_done)
            return
        if done.key in self.twins and self.twins[done.key] is None:
            self.held[done.key] = done  # wait for its twin
            return
        self._write(done)

    def _write(self, done: Finished) -> None:
        item, attempt_id = self.in_flight.pop(done.key)
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
        if self.context.tx(store.finish_item, item=item, attempt_id=attempt_id, result=row):
            self.outcome.done += 1
        else:
            log.warning(
                "job %s item %s: finished after its lease was taken over; result dropped",
                item.job_id,
                item.seq,
            )

    def _lose_batch(self, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        self.runner.engine.abandon()
        log.warning(
            "job %s: a batch failed (%s); its %d items run alone\n%s",
            self.context.job_id,
            error,
            len(self.in_flight),
            traceback.format_exc(),
        )
        for item, attempt_id in self.in_flight.values():
            self.context.tx(store.release_for_retry, item=item, attempt_id=attempt_id, error=error)
            self.alone.append(item.id)
        self.in_flight.clear()
        self.twins.clear()
        self.held.clear()

    def _fail(self, item: Item, attempt_id: int, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if item.attempts > 1:
            error += f" (attempt {item.attempts} of {self.context.settings.max_attempts})"
        log.warning("job %s item %s failed: %s", item.job_id, item.seq, error)
        self.context.tx(store.fail_item, item=item, attempt_id=attempt_id, error=error)
        self.outcome.failed += 1

    # --- one item alone, retried with backoff -----------------------------------------------------------
    def _single(self, item_id: int) -> bool:
        """Claim, decode and record one item, trying again after an error; False: stop the chunk."""
        settings, engine = self.context.settings, self.runner.engine
        while True:
            before = self.outcome.failed
            self._admit(item_id)
            if self.outcome.stopped:
                return False
            if item_id not in self.in_flight:  # refused, or failed at once
                return True
            item, attempt_id = self.in_flight[item_id]
            try:
                while engine.busy:
                    for done in engine.step():
                        self._finished(done)
                return True
            except Exception as exc:
                engine.abandon()
                self.in_flight.pop(item_id)
                self.twins.pop(item_id, None)
                self.held.pop(item_id, None)
                if isinstance(exc, PERMANENT_ITEM_ERRORS) or item.attempts >= settings.max_attempts:
                    log.warning("%s", traceback.format_exc())
                    self._fail(item, attempt_id, exc)
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
                self.context.tx(store.release_for_retry, item=item, attempt_id=attempt_id, error=error)
                self.outcome.retried += 1
                assert self.outcome.failed == before
                time.sleep(delay)
