"""The batched path of a chunk: several items per forward pass through ``genjob.generation.batched``.

Items are claimed lazily as batch slots free up and written as they finish. Must not know: HTTP.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from functools import lru_cache

from sqlalchemy import select
from sqlalchemy.orm import Session

from genjob import store
from genjob.constants import TERMINAL_JOB_STATUSES, DecodingMode
from genjob.generation.batched import BatchRequest, speculative_decode_batch
from genjob.generation.costs import probe_batch_size
from genjob.generation.engine import Decoded
from genjob.generation.loading import load_model
from genjob.settings import Settings
from genjob.tables import Item, Job
from genjob.worker.items import ChunkContext, ChunkOutcome, fail, finish, run_item
from genjob.worker.runners import ItemOutput, JobRunner

log = logging.getLogger(__name__)


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


def _job_flags(session: Session, *, job_id: str) -> tuple[bool, bool]:
    """(the job ended, the speedup guard switched it to plain decoding)."""
    status, guard_tripped = session.execute(
        select(Job.status, Job.guard_tripped).where(Job.id == job_id)
    ).one()
    return status in TERMINAL_JOB_STATUSES, guard_tripped


def run_batched(
    runner: JobRunner,
    item_ids: list[int],
    *,
    context: ChunkContext,
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
                store.claim_item,
                item_id=item_id,
                worker=context.holder,
                lease_s=settings.lease_s,
                max_attempts=settings.max_attempts,
            )
            if claimed is store.Refused.JOB_ENDED:
                outcome.stopped = True
                todo.clear()
                return
            if isinstance(claimed, store.Refused):
                outcome.skipped += 1
                continue
            item, attempt_id = claimed
            max_new_tokens = runner.options(item).max_new_tokens
            try:
                input_ids = runner.encode(item.prompt, max_new_tokens)
                request = BatchRequest(key=item.id, input_ids=input_ids, max_new_tokens=max_new_tokens)
            except Exception as exc:  # PromptTooLong, an empty prompt: no other try can help
                fail(context, item, attempt_id, exc, outcome)
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
                    tx(store.release_for_retry, item=item, attempt_id=attempt_id, error=error)
                    alone.append(item.id)
                in_flight.clear()
                break
            item, attempt_id, input_ids = in_flight.pop(key)
            output = _batched_output(runner, item, input_ids, decoded, plain=plain)
            if tx(
                finish,
                item=item,
                attempt_id=attempt_id,
                output=output,
                context=context,
                guard_after=guard_after,
            ):
                outcome.done += 1
    for item_id in alone:
        if outcome.stopped or not run_item(
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
