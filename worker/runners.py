"""A job's runner in a worker process: its models, tokenizer and engine, built once per job and cached.

Turns the job's options into the engine's (proposer, γ bounds, probe rounds, batch size) and an item
into a ``Request`` (encoding the prompt and checking the model's context). The costs of the device
are read once per model pair and batch size (``genjob.generation.cost_cache``: what earlier
processes kept, plus a cheap prior for the rows they lack); a plain job with its batch size given
needs none and measures nothing.
Must not know: Celery, the store's SQL.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from threading import Lock
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from genjob.constants import DecodingMode, DraftSchedule
from genjob.generation import cost_cache
from genjob.generation.cost_cache import cost_file, measured_costs
from genjob.generation.cost_timing import grid_batches
from genjob.generation.costs import CostModel, suggested_batch_size
from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import Engine
from genjob.generation.forward import max_positions
from genjob.generation.loading import check_same_vocabulary, eos_ids, load_model, load_tokenizer
from genjob.generation.loops import ends_in_a_loop
from genjob.generation.proposer_mix import ProposerMix
from genjob.generation.proposers import PromptLookup, Proposer
from genjob.generation.requests import Finished, Request
from genjob.generation.stopping import cut_at_stop, stop_check
from genjob.generation.suffix_cache import SuffixCache, SuffixLookup
from genjob.options import JobSpec
from genjob.settings import Settings
from genjob.store.claims import ClaimedItem
from genjob.worker.metrics import note_runner_built

log = logging.getLogger(__name__)

MAX_CACHED_RUNNERS = 16
LARGEST_PROBED_BATCH = 64
CHUNK_PER_BATCH = 4  # default items per task message: four batches, so a chunk's tail is short


SEED_MASK = 2**63 - 1


class PromptTooLong(ValueError):
    pass


# Errors that another try cannot fix: the item fails at once.
PERMANENT_ITEM_ERRORS: tuple[type[Exception], ...] = (PromptTooLong,)


def calibrate(spec: JobSpec, *, settings: Settings) -> tuple[CostModel, int, int]:
    """``genjob calibrate``: the thorough grid for the job's models up to its batch size (or the one
    the device suggests) and draft length, kept for the jobs that follow: (costs, batch, k_max)."""
    device, dtype, models = settings.device, settings.dtype, settings.model_cache_dir
    target = load_model(spec.model, device, dtype, cache_dir=models)
    draft = None
    if spec.mode is DecodingMode.DRAFT and spec.assistant is not None:
        draft = load_model(spec.assistant, device, dtype, cache_dir=models)
    k_max = _draft_length(spec) if spec.mode is not DecodingMode.NONE else 0
    batch = batch_size_for(spec, settings) or _suggested(spec.model, settings)
    path = cost_file(settings.cost_cache_dir, target, draft)
    return cost_cache.calibrate(path, target, draft, max_batch=batch, max_query=k_max + 1), batch, k_max


def _draft_length(spec: JobSpec) -> int:
    """γmax: the draft's tokens with a draft model, else prompt lookup's (mode auto without a draft too)."""
    if spec.mode is DecodingMode.PROMPT_LOOKUP or (spec.mode is DecodingMode.AUTO and not spec.assistant):
        return spec.prompt_lookup_tokens
    return spec.draft_tokens


def _suggested(model: str, settings: Settings) -> int:
    """The batch size the device suggests for plain decoding of ``model``, from one-token steps
    measured (or read) at B = 1, 2, 4, … up to 64."""
    grid = tuple(grid_batches(LARGEST_PROBED_BATCH))
    device, dtype, costs_dir = settings.device, settings.dtype, settings.cost_cache_dir
    plain, _ = measured_costs(model, None, device, dtype, grid, 1, costs_dir, settings.model_cache_dir)
    return suggested_batch_size(plain)


def set_torch_threads(settings: Settings) -> None:
    """GENJOB_TORCH_THREADS for this process's torch (unset: torch's own default)."""
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)


def batch_size_for(spec: JobSpec, settings: Settings) -> int | None:
    """The job's --batch-size, else GENJOB_BATCH_SIZE; None: the device decides (``suggested_batch_size``)."""
    return spec.batch_size or settings.batch_size


@dataclass
class JobRunner:
    """A job's tokenizer and engine; the engine keeps the job's acceptance estimates and γ across chunks."""

    spec: JobSpec
    engine: Engine
    tokenizer: PreTrainedTokenizerBase
    eos_ids: frozenset[int]
    context: int | None
    batch_size: int  # rows per batch on this worker (the engine halves it for a while after an OOM)
    # Seconds this worker spent measuring costs for speculation (plain decoding measures none):
    # charged once to the job's speculative side, so its measured speedup stays honest for short jobs.
    setup_extra_s: float = 0.0
    cost_path: Path | None = None  # where the engine's costs are kept (``keep_costs``)

    def release(self) -> None:
        """Give the engine's K/V caches back (a chunk ended, or the runner is evicted): a finished job
        keeps none; the job's next chunk here reserves them again. Its models stay loaded."""
        self.engine.abandon()
        self.engine.release()

    def take_setup_extra(self) -> float:
        extra, self.setup_extra_s = self.setup_extra_s, 0.0
        return extra

    def keep_costs(self) -> None:
        """Merge what the engine's rounds learnt about the costs into the kept file, for later processes
        (a failure to keep them is logged, never the chunk's)."""
        if self.engine.costs is None:
            return
        try:
            cost_cache.remember(self.cost_path, self.engine.costs)
        except Exception as exc:
            log.warning("cost model: could not keep what this chunk learnt: %s", exc)

    @classmethod
    def build(cls, spec: JobSpec, *, settings: Settings) -> JobRunner:
        """Load the job's models (cached by name) and make its engine."""
        device, dtype, models = settings.device, settings.dtype, settings.model_cache_dir
        target = load_model(spec.model, device, dtype, cache_dir=models)
        proposer: Proposer | None = None
        draft = None
        if spec.mode in (DecodingMode.DRAFT, DecodingMode.AUTO) and spec.assistant is not None:
            check_same_vocabulary(spec.model, spec.assistant, cache_dir=models)
            draft = spec.assistant
            proposer = DraftModel(load_model(draft, device, dtype, cache_dir=models))
        if spec.mode is DecodingMode.PROMPT_LOOKUP:
            proposer = PromptLookup(max_ngram=3)
        elif spec.mode is DecodingMode.AUTO:  # the cheapest first: it wins a tie
            job_outputs = SuffixLookup(SuffixCache(), max_ngram=3)
            proposer = ProposerMix(
                [PromptLookup(max_ngram=3), job_outputs, *([proposer] if proposer else [])]
            )
        gamma = _draft_length(spec)
        k_max = gamma if proposer is not None else 0
        batch = batch_size_for(spec, settings) or _suggested(spec.model, settings)
        probe_every = (
            round(1 / spec.baseline_fraction) if proposer is not None and spec.baseline_fraction else 0
        )
        costs, path, extra = None, None, 0.0
        if proposer is not None:
            misses = measured_costs.cache_info().misses
            costs, path = measured_costs(
                spec.model, draft, device, dtype, (1, batch), k_max + 1, settings.cost_cache_dir, models
            )
            fresh = measured_costs.cache_info().misses > misses  # (measure_seconds is 0 when read)
            extra = costs.measure_seconds if fresh else 0.0
        engine = Engine(
            target,
            proposer,
            max_rows=batch,
            k_max=k_max,
            fixed_k=gamma if spec.schedule is DraftSchedule.CONSTANT and proposer else None,
            costs=costs,
            probe_every=probe_every,
            kv_budget_bytes=settings.kv_cache_bytes,
        )
        tokenizer = load_tokenizer(spec.model, cache_dir=models)
        eos = eos_ids(target, tokenizer)
        return cls(spec, engine, tokenizer, eos, max_positions(target), batch, extra, path)

    def request(self, item: ClaimedItem, *, key: int | None = None, plain: bool = False) -> Request:
        """The item as the engine's request; ``plain``: a twin decoded without drafts (the lossless check).

        The line's own settings (temperature, top_p, seed, stop strings) win over the job's."""
        spec = self.spec
        max_new_tokens = item.max_new_tokens or spec.max_new_tokens
        ids = self.tokenizer(item.prompt)["input_ids"]
        if self.context is not None and len(ids) + max_new_tokens > self.context:
            raise PromptTooLong(
                f"prompt of {len(ids)} tokens + max_new_tokens {max_new_tokens} exceeds the model's "
                f"context of {self.context} tokens"
            )
        seed = (spec.seed if spec.seed is not None else zlib.crc32(item.job_id.encode())) + item.seq
        if item.seed is not None:
            seed = item.seed & SEED_MASK  # OpenAI's seeds may be negative; the same seed, the same draws
        return Request(
            key=item.id if key is None else key,
            input_ids=ids,
            max_new_tokens=max_new_tokens,
            temperature=spec.temperature if item.temperature is None else item.temperature,
            top_p=spec.top_p if item.top_p is None else item.top_p,
            seed=seed,
            eos_ids=self.eos_ids,
            stop=stop_check(self.tokenizer, item.stop) if item.stop else None,
            draft_limit=0 if plain else None,
        )

    def learn(self, done: Finished) -> None:
        """A row finished: its output joins the job's suffix cache (mode auto), for the rows after it."""
        if self.engine.proposer is not None:
            self.engine.proposer.add_output(done.token_ids)

    def is_lossless_sample(self, seq: int) -> bool:
        """Greedy speculative jobs decode every 1/F-th item (the first always) again without drafts."""
        spec = self.spec
        if spec.mode is DecodingMode.NONE or spec.do_sample or spec.baseline_fraction <= 0:
            return False
        return seq % max(1, round(1 / spec.baseline_fraction)) == 0

    def text(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))


class RunnerCache:
    """Per-process cache of job runners (models themselves are cached by name in ``loading``); an
    evicted runner's caches are released (``JobRunner.release``), as at the end of each chunk.

    ``build`` makes a job's runner: ``JobRunner.build`` in production; tests swap in a stand-in
    (a fixture in-process; ``tests/doubles/scripted_worker.py`` in a test worker process)."""

    def __init__(self, build: Callable[..., Any], size: int = MAX_CACHED_RUNNERS) -> None:
        self.build = build
        self._runners: OrderedDict[str, Any] = OrderedDict()
        self._size = size
        self._lock = Lock()

    def get(self, job_id: str, spec: JobSpec, *, settings: Settings) -> JobRunner:
        with self._lock:
            runner = self._runners.get(job_id)
            if runner is None:
                started = time.perf_counter()
                runner = self.build(spec, settings=settings)
                note_runner_built(spec, time.perf_counter() - started, getattr(runner, "setup_extra_s", 0.0))
                self._runners[job_id] = runner
                while len(self._runners) > self._size:
                    _, evicted = self._runners.popitem(last=False)
                    evicted.release()
            self._runners.move_to_end(job_id)
            return runner


RUNNERS = RunnerCache(JobRunner.build)


def result_row(
    runner: JobRunner, done: Finished, worker: str, lossless: bool | None, stop: list[str] | None = None
) -> dict[str, Any]:
    """An item's result row (``genjob.store.finish_items``): its text, cut at a stop string, and its stats."""
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
        "proposer_counts": proposer_counts(stats.by_proposer) or None,
        "looping": ends_in_a_loop(done.token_ids),
    }


PROPOSER_FIELDS = ("rounds", "proposed", "accepted", "rejections")  # RowStats.by_proposer's order


def proposer_counts(by_proposer: dict[str, list[int]]) -> dict[str, int]:
    """Per-proposer tallies as stored (``tables.PROPOSER_COUNTS``): flat ``name:field`` keys."""
    return {
        f"{name}:{field}": value
        for name, tally in by_proposer.items()
        for field, value in zip(PROPOSER_FIELDS, tally, strict=True)
    }
