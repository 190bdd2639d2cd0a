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
(``_process_chunk_batched``): items are claimed as batch slots free up and written as they finish.
"""

from __future__ import annotations

import logging
import math
import socket
import traceback
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from threading import Lock

from genjob import crud
from genjob.constants import TERMINAL_JOB_STATUSES, DecodingMode
from genjob.db import session_scope
from genjob.jobspec import JobSpec
from genjob.models import Item, Job
from genjob.settings import Settings
from worker.batched import BatchRequest, probe_batch_size, speculative_decode_batch
from worker.engine import Decoded, DecodeOptions, Engine, cost_ratio
from worker.loading import ModelLoadError, check_same_vocabulary, load_model, load_tokenizer

log = logging.getLogger(__name__)

MAX_CACHED_ENGINES = 16
WARM_UP_PROMPT = "def main():\n    "


class PromptTooLong(ValueError):
    pass


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

    def get(self, job_id: str, spec: JobSpec, *, device: str, draft_tokens: int | None) -> JobRunner:
        with self._lock:
            runner = self._runners.get(job_id)
            if runner is None:
                runner = JobRunner.build(spec, device=device, draft_tokens=draft_tokens)
                self._runners[job_id] = runner
                while len(self._runners) > self._size:
                    self._runners.popitem(last=False)
            self._runners.move_to_end(job_id)
            return runner


RUNNERS = RunnerCache()


@dataclass
class ChunkOutcome:
    done: int = 0
    failed: int = 0
    skipped: int = 0
    stopped: bool = False


def worker_name() -> str:
    return socket.gethostname()


def guard_sample_size(settings: Settings, job: Job, spec: JobSpec) -> int:
    """How many sampled items the guard waits for: its minimum, or all the job will ever have."""
    if spec.baseline_fraction <= 0:
        return 0
    samples = math.ceil(job.total / max(1, round(1 / spec.baseline_fraction)))
    return max(1, min(settings.guard_min_items, samples))


def process_chunk(*, settings: Settings, job_id: str, item_ids: list[int], worker: str) -> ChunkOutcome:
    """Generate every open item of the chunk in order; stop early if the job ends meanwhile."""
    url = settings.database_url
    outcome = ChunkOutcome()
    with session_scope(url) as session:
        job = session.get(Job, job_id)
        if job is None or job.status in TERMINAL_JOB_STATUSES:
            outcome.skipped, outcome.stopped = len(item_ids), True
            return outcome
        crud.mark_job_running(session, job_id=job_id)
        spec = JobSpec.model_validate(job.spec)
        guard_after = guard_sample_size(settings, job, spec)
    try:
        runner = RUNNERS.get(job_id, spec, device=settings.device, draft_tokens=job.draft_tokens)
    except ModelLoadError as exc:
        log.error("job %s: %s", job_id, exc)
        with session_scope(url) as session:
            crud.fail_job(session, job_id=job_id, error=str(exc))
        outcome.stopped = True
        return outcome
    with session_scope(url) as session:
        crud.record_cost_ratio(session, job_id=job_id, cost_ratio=runner.cost_ratio)

    batch_size = batch_size_for(runner, settings) if len(item_ids) > 1 else 1
    if batch_size > 1:
        return _process_chunk_batched(
            settings=settings,
            job_id=job_id,
            item_ids=item_ids,
            worker=worker,
            runner=runner,
            batch_size=batch_size,
            guard_after=guard_after,
        )
    for item_id in item_ids:
        with session_scope(url) as session:
            job = session.get(Job, job_id, populate_existing=True)
            if job.status in TERMINAL_JOB_STATUSES:
                outcome.stopped = True
                break
            plain_only = job.guard_tripped
            claimed = crud.claim_item(session, item_id=item_id, worker=worker)
        if claimed is None:
            outcome.skipped += 1
            continue
        item, attempt_id = claimed
        try:
            output = runner.decode(item, plain_only=plain_only)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.warning("job %s item %s failed: %s\n%s", job_id, item.seq, error, traceback.format_exc())
            with session_scope(url) as session:
                crud.fail_item(session, item=item, attempt_id=attempt_id, error=error)
            outcome.failed += 1
            continue
        with session_scope(url) as session:
            crud.finish_item(session, item=item, attempt_id=attempt_id, result=output.result_row(worker))
            if output.baseline is not None:
                crud.check_speedup_guard(
                    session, job_id=job_id, min_items=guard_after, threshold=settings.guard_threshold
                )
        outcome.done += 1

    with session_scope(url) as session:
        job = session.get(Job, job_id)
        if runner.spec.mode is DecodingMode.DRAFT:
            job.draft_tokens = runner.engine.draft_tokens
        crud.finalize_job(session, job_id=job_id)
    return outcome


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


def _process_chunk_batched(
    *,
    settings: Settings,
    job_id: str,
    item_ids: list[int],
    worker: str,
    runner: JobRunner,
    batch_size: int,
    guard_after: int,
) -> ChunkOutcome:
    """Like the one-at-a-time loop, but items are claimed lazily as batch slots free up and written
    as they finish. Sampled items also get their plain batch-1 baseline once they finish (so the
    job's speedup is batched assisted vs plain one-at-a-time); when the speedup guard trips, the
    batch drains and the rest decodes as batched plain greedy. A crash of the batch fails the
    items in it; the rest go on."""
    url = settings.database_url
    outcome = ChunkOutcome()
    todo = deque(item_ids)
    in_flight: dict[int, tuple[Item, int, list[int]]] = {}

    def requests(plain: bool) -> Iterator[BatchRequest]:
        while todo:
            item_id = todo.popleft()
            with session_scope(url) as session:
                job = session.get(Job, job_id, populate_existing=True)
                if job.status in TERMINAL_JOB_STATUSES:
                    outcome.stopped = True
                    todo.clear()
                    return
                if job.guard_tripped and not plain:  # drain this batch, go on plainly
                    todo.appendleft(item_id)
                    return
                claimed = crud.claim_item(session, item_id=item_id, worker=worker)
            if claimed is None:
                outcome.skipped += 1
                continue
            item, attempt_id = claimed
            max_new_tokens = runner.options(item).max_new_tokens
            try:
                input_ids = runner.encode(item.prompt, max_new_tokens)
            except Exception as exc:
                _fail(url, item, attempt_id, exc, outcome)
                continue
            in_flight[item.id] = (item, attempt_id, input_ids)
            yield BatchRequest(key=item.id, input_ids=input_ids, max_new_tokens=max_new_tokens)

    engine = runner.engine
    log.info("job %s: %d items, batches of %d", job_id, len(item_ids), batch_size)
    while todo:
        with session_scope(url) as session:
            plain = runner.spec.mode is DecodingMode.NONE or session.get(Job, job_id).guard_tripped
        decoding = speculative_decode_batch(
            engine.target,
            None if plain else engine.assistant,
            requests(plain),
            batch_size=batch_size,
            draft_tokens=engine.draft_tokens,
            eos_token_id=engine.eos_token_id,
        )
        while True:
            try:
                key, decoded = next(decoding)
            except StopIteration:
                break
            except Exception as exc:  # the batch is lost: fail its items, go on with the rest
                for item, attempt_id, _ in in_flight.values():
                    _fail(url, item, attempt_id, exc, outcome)
                in_flight.clear()
                break
            item, attempt_id, input_ids = in_flight.pop(key)
            output = _batched_output(runner, item, input_ids, decoded, plain=plain)
            with session_scope(url) as session:
                crud.finish_item(session, item=item, attempt_id=attempt_id, result=output.result_row(worker))
                if output.baseline is not None:
                    crud.check_speedup_guard(
                        session, job_id=job_id, min_items=guard_after, threshold=settings.guard_threshold
                    )
            outcome.done += 1

    with session_scope(url) as session:
        if runner.spec.mode is DecodingMode.DRAFT:
            session.get(Job, job_id).draft_tokens = engine.draft_tokens  # constant γ while batched
        crud.finalize_job(session, job_id=job_id)
    return outcome


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


def _fail(url: str, item: Item, attempt_id: int, exc: Exception, outcome: ChunkOutcome) -> None:
    error = f"{type(exc).__name__}: {exc}"
    log.warning("job %s item %s failed: %s\n%s", item.job_id, item.seq, error, traceback.format_exc())
    with session_scope(url) as session:
        crud.fail_item(session, item=item, attempt_id=attempt_id, error=error)
    outcome.failed += 1
