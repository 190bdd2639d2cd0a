"""Run one chunk of a job: claim each item, generate, write the result; cooperative cancel.

Sits between the Celery task (which only passes ids) and the engine (which only sees token ids):
it owns the database writes and the per-process caches of models and per-job engines.

Measured speedup: every ``1/baseline_fraction``-th item (the job's first item always) is also
decoded plainly by the target, right after its assisted decode, in the same process; the job sums
both times over that sample (speedup = plain / assisted) and counts greedy outputs that match
(the lossless rate). Speedup guard: once ``guard_min_items`` sampled items (or every sampled item
of a small job) show a speedup under ``guard_threshold``, the rest of the job decodes plainly and
the job records that it did and why.

Batched: a chunk of several items of a greedy draft/none job goes through ``worker/batched.py``
(``_run_batched``): items are claimed as batch slots free up and written as they finish.

Reliability: the chunk's items are leased to this process (renewed by a ``LeaseKeeper`` thread),
so no other worker runs them while it lives and the sweeper takes them back once it dies. Every
database write is a short transaction retried with backoff on a dropped connection. An item that
raises is tried again up to ``max_attempts`` times, then failed with its error; the job goes on.
Before each item the chunk stops if the job was cancelled or its deadline passed.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
import os
import socket
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from threading import Lock

from sqlalchemy import select

from genjob import crud, leases
from genjob.constants import TERMINAL_JOB_STATUSES, DecodingMode
from genjob.db import run_transaction
from genjob.jobspec import JobSpec
from genjob.models import Item, Job
from genjob.settings import Settings
from worker.batched import BatchRequest, probe_batch_size, speculative_decode_batch
from worker.engine import Decoded, DecodeOptions, Engine, cost_ratio
from worker.loading import ModelLoadError, check_same_vocabulary, load_model, load_tokenizer

log = logging.getLogger(__name__)

MAX_CACHED_ENGINES = 16
MAX_RETRY_BACKOFF_S = 60.0
WARM_UP_PROMPT = "def main():\n    "


class PromptTooLong(ValueError):
    pass


# Errors that another try cannot fix: the item fails at once.
PERMANENT_ITEM_ERRORS: tuple[type[Exception], ...] = (PromptTooLong,)


@dataclass
class JobRunner:
    """A job's tokenizer and engine; the engine keeps the job's learned draft length across chunks."""

    spec: JobSpec
    engine: Engine
    tokenizer: object
    max_positions: int | None
    cost_ratio: float | None

    @classmethod
    def build(cls, spec: JobSpec, *, device: str, draft_tokens: int | None = None) -> JobRunner:
        target = load_model(spec.model, device)
        assistant = None
        if spec.mode is DecodingMode.DRAFT:
            assert spec.assistant is not None
            check_same_vocabulary(spec.model, spec.assistant)
            assistant = load_model(spec.assistant, device)
        tokenizer = load_tokenizer(spec.model)
        engine = Engine(
            target,
            assistant=assistant,
            mode=spec.mode,
            draft_tokens=draft_tokens or spec.draft_tokens,
            schedule=spec.schedule,
            prompt_lookup_tokens=spec.prompt_lookup_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        config = target.config
        positions = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
        warm_up_ids = tokenizer(WARM_UP_PROMPT)["input_ids"]
        engine.warm_up(warm_up_ids)
        ratio = {DecodingMode.DRAFT: None, DecodingMode.PROMPT_LOOKUP: 0.0, DecodingMode.NONE: None}[
            spec.mode
        ]
        if assistant is not None:
            ratio = cost_ratio(target, assistant, warm_up_ids)
        return cls(spec=spec, engine=engine, tokenizer=tokenizer, max_positions=positions, cost_ratio=ratio)

    def encode(self, prompt: str, max_new_tokens: int) -> list[int]:
        ids = self.tokenizer(prompt)["input_ids"]
        if self.max_positions is not None and len(ids) + max_new_tokens > self.max_positions:
            raise PromptTooLong(
                f"prompt of {len(ids)} tokens + max_new_tokens {max_new_tokens} exceeds the model's "
                f"context of {self.max_positions} tokens"
            )
        return ids

    def options(self, item: Item) -> DecodeOptions:
        return DecodeOptions(
            max_new_tokens=item.max_new_tokens or self.spec.max_new_tokens,
            temperature=self.spec.temperature,
            top_p=self.spec.top_p,
            seed=None if self.spec.seed is None else self.spec.seed + item.seq,
        )

    def is_baseline_sample(self, seq: int) -> bool:
        if self.spec.mode is DecodingMode.NONE or self.spec.baseline_fraction <= 0:
            return False
        return seq % max(1, round(1 / self.spec.baseline_fraction)) == 0

    def decode(self, item: Item, *, plain_only: bool = False) -> ItemOutput:
        """Decode one item; on sampled items also run the plain baseline for the A/B."""
        options = self.options(item)
        ids = self.encode(item.prompt, options.max_new_tokens)
        mode = DecodingMode.NONE if plain_only else self.spec.mode
        decoded = self.engine.generate(ids, options, mode=mode)
        baseline = None
        if not plain_only and self.is_baseline_sample(item.seq):
            baseline = self.engine.generate(ids, options, mode=DecodingMode.NONE)
        if baseline is not None and not self.spec.do_sample and baseline.token_ids != decoded.token_ids:
            log.warning(
                "item %s: assisted output differs from plain greedy: %s vs %s",
                item.seq,
                decoded.token_ids,
                baseline.token_ids,
            )
        text = self.tokenizer.decode(decoded.token_ids, skip_special_tokens=True)
        return ItemOutput(
            decoded=decoded, text=text, mode=mode, baseline=baseline, greedy=not self.spec.do_sample
        )


@dataclass
class ItemOutput:
    decoded: Decoded
    text: str
    mode: DecodingMode
    baseline: Decoded | None
    greedy: bool

    def result_row(self, worker: str) -> dict:
        stats = self.decoded.stats
        row = {
            "output": self.text,
            "finish_reason": stats.finish_reason,
            "mode": self.mode.value,
            "prompt_tokens": stats.prompt_tokens,
            "new_tokens": stats.new_tokens,
            "target_rounds": stats.target_rounds,
            "draft_proposed": stats.draft_proposed,
            "draft_accepted": stats.draft_accepted,
            "latency_s": stats.latency_s,
            "baseline_latency_s": None,
            "baseline_match": None,
            "worker": worker,
        }
        if self.baseline is not None:
            row["baseline_latency_s"] = self.baseline.stats.latency_s
            if self.greedy:
                row["baseline_match"] = self.baseline.token_ids == self.decoded.token_ids
        return row


class RunnerCache:
    """Per-process cache of job runners (models themselves are cached by name in ``loading``)."""

    def __init__(self, size: int = MAX_CACHED_ENGINES) -> None:
        self._runners: OrderedDict[str, JobRunner] = OrderedDict()
        self._size = size
        self._lock = Lock()

    def get(
        self,
        job_id: str,
        spec: JobSpec,
        *,
        device: str,
        draft_tokens: int | None,
        build: Callable[..., JobRunner] = JobRunner.build,
    ) -> JobRunner:
        with self._lock:
            runner = self._runners.get(job_id)
            if runner is None:
                runner = build(spec, device=device, draft_tokens=draft_tokens)
                self._runners[job_id] = runner
                while len(self._runners) > self._size:
                    self._runners.popitem(last=False)
            self._runners.move_to_end(job_id)
            return runner


RUNNERS = RunnerCache()


@functools.cache
def runner_builder(factory: str | None) -> Callable[..., JobRunner]:
    """``JobRunner.build``, or the stand-in named by ``Settings.runner_factory`` (tests, benchmarks)."""
    if not factory:
        return JobRunner.build
    module, _, name = factory.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass
class ChunkOutcome:
    done: int = 0
    failed: int = 0
    skipped: int = 0
    retried: int = 0
    stopped: bool = False


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


def _open_chunk(
    session, *, job_id: str, item_ids: list[int], holder: str, settings: Settings
) -> tuple[JobSpec, list[int], int | None, int] | None:
    """(spec, the chunk's items now leased to us in order, learned γ, guard sample size), or None
    if the job ended."""
    job = session.get(Job, job_id)
    if job is None or job.status in TERMINAL_JOB_STATUSES:
        return None
    if job.expires_at is not None and crud.expire_due_jobs(session, job_id=job_id):
        return None
    crud.mark_job_running(session, job_id=job_id)
    reserved = leases.reserve_items(session, item_ids=item_ids, worker=holder, lease_s=settings.lease_s)
    spec = JobSpec.model_validate(job.spec)
    mine = [item_id for item_id in item_ids if item_id in reserved]
    return spec, mine, job.draft_tokens, guard_sample_size(settings, job, spec)


def _close_chunk(session, *, job_id: str, item_ids: list[int], holder: str, draft_tokens: int | None) -> None:
    leases.release_reservations(session, item_ids=item_ids, worker=holder)
    if draft_tokens is not None:
        session.get(Job, job_id).draft_tokens = draft_tokens
    crud.finalize_job(session, job_id=job_id)


def retry_delay(settings: Settings, attempts: int) -> float:
    """Backoff before try ``attempts + 1``: retry_backoff_s, then doubling, at most a minute."""
    return min(settings.retry_backoff_s * 2 ** (attempts - 1), MAX_RETRY_BACKOFF_S)


def guard_sample_size(settings: Settings, job: Job, spec: JobSpec) -> int:
    """How many sampled items the guard waits for: its minimum, or all the job will ever have."""
    if spec.baseline_fraction <= 0:
        return 0
    samples = math.ceil(job.total / max(1, round(1 / spec.baseline_fraction)))
    return max(1, min(settings.guard_min_items, samples))


def process_chunk(*, settings: Settings, job_id: str, item_ids: list[int], worker: str) -> ChunkOutcome:
    """Generate every open item of the chunk in order; stop early if the job ends meanwhile."""
    tx = functools.partial(run_transaction, settings.database_url, retry_s=settings.db_retry_s)
    holder = lease_holder(worker)
    outcome = ChunkOutcome()
    opened = tx(_open_chunk, job_id=job_id, item_ids=item_ids, holder=holder, settings=settings)
    if opened is None:
        outcome.skipped, outcome.stopped = len(item_ids), True
        return outcome
    spec, mine, draft_tokens, guard_after = opened
    outcome.skipped = len(item_ids) - len(mine)  # final, or held by another live worker
    if not mine:
        tx(crud.finalize_job, job_id=job_id)
        return outcome
    # The leases are renewed from here on: loading the models may take longer than a lease.
    with LeaseKeeper(settings, item_ids=mine, holder=holder):
        try:
            runner = RUNNERS.get(
                job_id,
                spec,
                device=settings.device,
                draft_tokens=draft_tokens,
                build=runner_builder(settings.runner_factory),
            )
        except ModelLoadError as exc:
            log.error("job %s: %s", job_id, exc)
            tx(crud.fail_job, job_id=job_id, error=str(exc))
            outcome.stopped = True
            return outcome
        tx(crud.record_cost_ratio, job_id=job_id, cost_ratio=runner.cost_ratio)
        context = _ChunkContext(settings=settings, job_id=job_id, holder=holder, worker=worker, tx=tx)
        batch_size = batch_size_for(runner, settings) if len(mine) > 1 else 1
        if batch_size > 1:
            _run_batched(
                runner, mine, context=context, guard_after=guard_after, outcome=outcome, size=batch_size
            )
        else:
            for item_id in mine:
                if not _run_item(runner, item_id, context=context, guard_after=guard_after, outcome=outcome):
                    outcome.stopped = True
                    break

    learned = runner.engine.draft_tokens if runner.spec.mode is DecodingMode.DRAFT else None
    tx(_close_chunk, job_id=job_id, item_ids=mine, holder=holder, draft_tokens=learned)
    return outcome


@dataclass(frozen=True)
class _ChunkContext:
    settings: Settings
    job_id: str
    holder: str  # the lease holder: worker name / pid
    worker: str
    tx: Callable


def _claim(session, *, item_id: int, holder: str, settings: Settings):
    """Claim the item; with it, whether the speedup guard switched the job to plain decoding."""
    claimed = crud.claim_item(
        session, item_id=item_id, worker=holder, lease_s=settings.lease_s, max_attempts=settings.max_attempts
    )
    if isinstance(claimed, crud.Refused):
        return claimed, False
    plain_only = session.scalar(select(Job.guard_tripped).where(Job.id == claimed[0].job_id))
    return claimed, bool(plain_only)


def _finish(
    session, *, item: Item, attempt_id: int, output: ItemOutput, context: _ChunkContext, guard_after: int
):
    finished = crud.finish_item(
        session, item=item, attempt_id=attempt_id, result=output.result_row(context.worker)
    )
    if finished and output.baseline is not None:
        crud.check_speedup_guard(
            session, job_id=context.job_id, min_items=guard_after, threshold=context.settings.guard_threshold
        )
    return finished


def _run_item(
    runner: JobRunner, item_id: int, *, context: _ChunkContext, guard_after: int, outcome: ChunkOutcome
) -> bool:
    """Claim, generate and record one item, trying again after an error; False: stop the chunk."""
    settings, tx, job_id = context.settings, context.tx, context.job_id
    while True:
        claimed, plain_only = tx(_claim, item_id=item_id, holder=context.holder, settings=settings)
        if claimed is crud.Refused.JOB_ENDED:
            return False
        if isinstance(claimed, crud.Refused):
            outcome.skipped += 1
            return True
        item, attempt_id = claimed
        try:
            output = runner.decode(item, plain_only=plain_only)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, PERMANENT_ITEM_ERRORS) or item.attempts >= settings.max_attempts:
                if item.attempts > 1:
                    error += f" (attempt {item.attempts} of {settings.max_attempts})"
                log.warning("job %s item %s failed: %s\n%s", job_id, item.seq, error, traceback.format_exc())
                tx(crud.fail_item, item=item, attempt_id=attempt_id, error=error)
                outcome.failed += 1
                return True
            delay = retry_delay(settings, item.attempts)
            log.warning(
                "job %s item %s: %s; try %d of %d in %.1f s",
                job_id,
                item.seq,
                error,
                item.attempts + 1,
                settings.max_attempts,
                delay,
            )
            tx(crud.release_for_retry, item=item, attempt_id=attempt_id, error=error)
            outcome.retried += 1
            time.sleep(delay)
            continue
        if tx(
            _finish, item=item, attempt_id=attempt_id, output=output, context=context, guard_after=guard_after
        ):
            outcome.done += 1
        else:
            log.warning(
                "job %s item %s: finished after its lease was taken over; result dropped", job_id, item.seq
            )
        return True


# --- batched decoding (worker/batched.py): several items of a chunk per forward pass -------------


@lru_cache(maxsize=8)
def _probed_batch_size(model: str, device: str, draft_tokens: int) -> int:
    return probe_batch_size(load_model(model, device), draft_tokens=draft_tokens)


def batch_size_for(runner: JobRunner, settings: Settings) -> int:
    """The job's --batch-size, else GENJOB_BATCH_SIZE, else a probe of the device (once per model);
    1 where batching does not apply (sampling, prompt lookup)."""
    spec = runner.spec
    if spec.do_sample or spec.mode is DecodingMode.PROMPT_LOOKUP:
        return 1
    if spec.batch_size is not None:
        return spec.batch_size
    if settings.batch_size is not None:
        return settings.batch_size
    return _probed_batch_size(spec.model, settings.device, spec.draft_tokens)


def _job_flags(session, *, job_id: str) -> tuple[bool, bool]:
    """(the job ended, the speedup guard switched it to plain decoding)."""
    status, guard_tripped = session.execute(
        select(Job.status, Job.guard_tripped).where(Job.id == job_id)
    ).one()
    return status in TERMINAL_JOB_STATUSES, guard_tripped


def _run_batched(
    runner: JobRunner,
    item_ids: list[int],
    *,
    context: _ChunkContext,
    guard_after: int,
    outcome: ChunkOutcome,
    size: int,
) -> None:
    """Like the one-at-a-time loop, but items are claimed lazily as batch slots free up and written
    as they finish. Sampled items also get their plain batch-1 baseline once they finish (so the
    job's speedup is batched assisted vs plain one-at-a-time); when the speedup guard trips, the
    batch drains and the rest decodes as batched plain greedy. If a batch crashes, its items go
    back (their try counted) and are run one at a time after the rest, with the usual bounded
    retries, so a poison item fails alone and its batch-mates finish."""
    settings, tx, job_id = context.settings, context.tx, context.job_id
    todo = deque(item_ids)
    alone: list[int] = []
    in_flight: dict[int, tuple[Item, int, list[int]]] = {}

    def requests(plain: bool) -> Iterator[BatchRequest]:
        while todo:
            item_id = todo.popleft()
            ended, guard_tripped = tx(_job_flags, job_id=job_id)
            if ended:
                outcome.stopped = True
                todo.clear()
                return
            if guard_tripped and not plain:  # drain this batch, go on plainly
                todo.appendleft(item_id)
                return
            claimed = tx(
                crud.claim_item,
                item_id=item_id,
                worker=context.holder,
                lease_s=settings.lease_s,
                max_attempts=settings.max_attempts,
            )
            if claimed is crud.Refused.JOB_ENDED:
                outcome.stopped = True
                todo.clear()
                return
            if isinstance(claimed, crud.Refused):
                outcome.skipped += 1
                continue
            item, attempt_id = claimed
            max_new_tokens = runner.options(item).max_new_tokens
            try:
                input_ids = runner.encode(item.prompt, max_new_tokens)
                request = BatchRequest(key=item.id, input_ids=input_ids, max_new_tokens=max_new_tokens)
            except Exception as exc:  # PromptTooLong, an empty prompt: no other try can help
                _fail(context, item, attempt_id, exc, outcome)
                continue
            in_flight[item.id] = (item, attempt_id, input_ids)
            yield request

    engine = runner.engine
    log.info("job %s: %d items, batches of %d", job_id, len(item_ids), size)
    while todo:
        plain = runner.spec.mode is DecodingMode.NONE or tx(_job_flags, job_id=job_id)[1]
        decoding = speculative_decode_batch(
            engine.target,
            None if plain else engine.assistant,
            requests(plain),
            batch_size=size,
            draft_tokens=engine.draft_tokens,
            eos_token_id=engine.eos_token_id,
        )
        while True:
            try:
                key, decoded = next(decoding)
            except StopIteration:
                break
            except Exception as exc:  # the batch is lost: its items go back, to be run one by one
                error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "job %s: a batch failed (%s); its %d items run alone", job_id, error, len(in_flight)
                )
                for item, attempt_id, _ in in_flight.values():
                    tx(crud.release_for_retry, item=item, attempt_id=attempt_id, error=error)
                    alone.append(item.id)
                in_flight.clear()
                break
            item, attempt_id, input_ids = in_flight.pop(key)
            output = _batched_output(runner, item, input_ids, decoded, plain=plain)
            if tx(
                _finish,
                item=item,
                attempt_id=attempt_id,
                output=output,
                context=context,
                guard_after=guard_after,
            ):
                outcome.done += 1
    for item_id in alone:
        if outcome.stopped or not _run_item(
            runner, item_id, context=context, guard_after=guard_after, outcome=outcome
        ):
            outcome.stopped = True
            break


def _batched_output(
    runner: JobRunner, item: Item, input_ids: list[int], decoded: Decoded, *, plain: bool
) -> ItemOutput:
    mode = DecodingMode.NONE if plain else runner.spec.mode
    baseline = None
    if not plain and runner.is_baseline_sample(item.seq):
        baseline = runner.engine.generate(input_ids, runner.options(item), mode=DecodingMode.NONE)
        if baseline.token_ids != decoded.token_ids:
            log.warning(
                "item %s: batched output differs from plain greedy: %s vs %s",
                item.seq,
                decoded.token_ids,
                baseline.token_ids,
            )
    text = runner.tokenizer.decode(decoded.token_ids, skip_special_tokens=True)
    return ItemOutput(decoded=decoded, text=text, mode=mode, baseline=baseline, greedy=True)


def _fail(context: _ChunkContext, item: Item, attempt_id: int, exc: Exception, outcome: ChunkOutcome) -> None:
    error = f"{type(exc).__name__}: {exc}"
    log.warning("job %s item %s failed: %s\n%s", item.job_id, item.seq, error, traceback.format_exc())
    context.tx(crud.fail_item, item=item, attempt_id=attempt_id, error=error)
    outcome.failed += 1
