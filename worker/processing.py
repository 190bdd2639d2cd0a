"""Run one chunk of a job: claim each item, generate, write the result; cooperative cancel.

Sits between the Celery task (which only passes ids) and the engine (which only sees token ids):
it owns the database writes and the per-process caches of models and per-job engines.
"""

from __future__ import annotations

import logging
import socket
import traceback
from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock

from genjob import crud
from genjob.constants import TERMINAL_JOB_STATUSES, DecodingMode
from genjob.db import session_scope
from genjob.jobspec import JobSpec
from genjob.models import Item, Job
from genjob.settings import Settings
from worker.engine import Decoded, DecodeOptions, Engine
from worker.loading import ModelLoadError, check_same_vocabulary, load_model, load_tokenizer

log = logging.getLogger(__name__)

MAX_CACHED_ENGINES = 16


class PromptTooLong(ValueError):
    pass


@dataclass
class JobRunner:
    """A job's tokenizer and engine; the engine keeps the job's learned draft length across chunks."""

    spec: JobSpec
    engine: Engine
    tokenizer: object
    max_positions: int | None

    @classmethod
    def build(cls, spec: JobSpec, *, device: str) -> JobRunner:
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
            draft_tokens=spec.draft_tokens,
            schedule=spec.schedule,
            prompt_lookup_tokens=spec.prompt_lookup_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        config = target.config
        positions = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
        return cls(spec=spec, engine=engine, tokenizer=tokenizer, max_positions=positions)

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

    def decode(self, item: Item) -> tuple[Decoded, str]:
        options = self.options(item)
        decoded = self.engine.generate(self.encode(item.prompt, options.max_new_tokens), options)
        return decoded, self.tokenizer.decode(decoded.token_ids, skip_special_tokens=True)


class RunnerCache:
    """Per-process cache of job runners (models themselves are cached by name in ``loading``)."""

    def __init__(self, size: int = MAX_CACHED_ENGINES) -> None:
        self._runners: OrderedDict[str, JobRunner] = OrderedDict()
        self._size = size
        self._lock = Lock()

    def get(self, job_id: str, spec: JobSpec, *, device: str) -> JobRunner:
        with self._lock:
            runner = self._runners.get(job_id)
            if runner is None:
                runner = JobRunner.build(spec, device=device)
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


def _result_row(runner: JobRunner, decoded: Decoded, text: str, worker: str) -> dict:
    stats = decoded.stats
    return {
        "output": text,
        "finish_reason": stats.finish_reason,
        "mode": runner.spec.mode.value,
        "prompt_tokens": stats.prompt_tokens,
        "new_tokens": stats.new_tokens,
        "target_rounds": stats.target_rounds,
        "draft_proposed": stats.draft_proposed,
        "draft_accepted": stats.draft_accepted,
        "latency_s": stats.latency_s,
        "worker": worker,
    }


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
    try:
        runner = RUNNERS.get(job_id, spec, device=settings.device)
    except ModelLoadError as exc:
        log.error("job %s: %s", job_id, exc)
        with session_scope(url) as session:
            crud.fail_job(session, job_id=job_id, error=str(exc))
        outcome.stopped = True
        return outcome

    for item_id in item_ids:
        with session_scope(url) as session:
            if session.get(Job, job_id, populate_existing=True).status in TERMINAL_JOB_STATUSES:
                outcome.stopped = True
                break
            claimed = crud.claim_item(session, item_id=item_id, worker=worker)
        if claimed is None:
            outcome.skipped += 1
            continue
        item, attempt_id = claimed
        try:
            decoded, text = runner.decode(item)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.warning("job %s item %s failed: %s\n%s", job_id, item.seq, error, traceback.format_exc())
            with session_scope(url) as session:
                crud.fail_item(session, item=item, attempt_id=attempt_id, error=error)
            outcome.failed += 1
            continue
        with session_scope(url) as session:
            crud.finish_item(
                session, item=item, attempt_id=attempt_id, result=_result_row(runner, decoded, text, worker)
            )
        outcome.done += 1

    with session_scope(url) as session:
        job = session.get(Job, job_id)
        if runner.spec.mode is DecodingMode.DRAFT:
            job.draft_tokens = runner.engine.draft_tokens
        crud.finalize_job(session, job_id=job_id)
    return outcome
