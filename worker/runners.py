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
from dataclasses import dataclass, fields
from pathlib import Path
from threading import Lock
from typing import Any, NamedTuple

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from genjob.constants import DecodingMode, DraftSchedule
from genjob.generation import cost_cache
from genjob.generation.context_fit import context_problem
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
from genjob.options import JobSpec, line_or_job
from genjob.proposer_tally import tallies_to_json
from genjob.settings import Settings
from genjob.store.claims import ClaimedItem
from genjob.tables import RESULT_FIELDS
from genjob.worker.chunk_context import Runner
from genjob.worker.metrics import note_runner_built

log = logging.getLogger(__name__)

MAX_CACHED_RUNNERS = 16
LARGEST_PROBED_BATCH = 64


SEED_MASK = 2**63 - 1


class PromptTooLong(ValueError):
    pass


def calibrate(spec: JobSpec, *, settings: Settings) -> tuple[CostModel, int, int]:
    """``genjob calibrate``: the thorough grid for the job's models (``load_job_models``: the ones its
    runner loads) up to its batch size (or the one the device suggests) and draft length, kept for
    the jobs that follow: (costs, batch, k_max)."""
    target, draft, _ = load_job_models(spec, settings)
    k_max = _k_max(spec)
    batch = _rows_per_batch(spec, settings)
    path = cost_file(settings.cost_cache_dir, target, draft)
    return cost_cache.calibrate(path, target, draft, max_batch=batch, max_query=k_max + 1), batch, k_max


def job_draft(spec: JobSpec) -> str | None:
    """The draft model a job loads: its assistant, in mode draft or auto (none in the other modes)."""
    return spec.assistant if spec.mode in (DecodingMode.DRAFT, DecodingMode.AUTO) else None


class JobModels(NamedTuple):
    target: PreTrainedModel
    draft: PreTrainedModel | None
    draft_seconds: float  # what checking and loading the draft took here (plain decoding loads none)


def load_job_models(spec: JobSpec, settings: Settings) -> JobModels:
    """The models a job runs (its target, and its draft: ``job_draft``), loaded as the workers load
    them: the one decision both ``JobRunner.build`` and ``calibrate`` take, so that the costs
    calibrate keeps are the ones the job's runner reads."""
    device, dtype, models = settings.device, settings.dtype, settings.model_cache_dir
    target = load_model(spec.model, device, dtype, cache_dir=models)
    draft = job_draft(spec)
    if draft is None:
        return JobModels(target, None, 0.0)
    started = time.perf_counter()
    check_same_vocabulary(spec.model, draft, cache_dir=models)
    loaded = load_model(draft, device, dtype, cache_dir=models)
    return JobModels(target, loaded, time.perf_counter() - started)


def _k_max(spec: JobSpec) -> int:
    """The most tokens a round of the job proposes: γmax, 0 in mode none (plain decoding)."""
    return 0 if spec.mode is DecodingMode.NONE else _draft_length(spec)


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
    """The job's --batch-size, else this worker's GENJOB_BATCH_SIZE; None: the device decides."""
    return settings.option_or_setting("batch_size", spec.batch_size)


def _rows_per_batch(spec: JobSpec, settings: Settings) -> int:
    """``batch_size_for``, else what the device suggests for the target (``suggested_batch_size``)."""
    return batch_size_for(spec, settings) or _suggested(spec.model, settings)


@dataclass
class JobRunner:
    """A job's tokenizer and engine; the engine keeps the job's acceptance estimates and γ across chunks."""

    spec: JobSpec
    engine: Engine
    tokenizer: PreTrainedTokenizerBase
    eos_ids: frozenset[int]
    context: int | None
    batch_size: int  # rows per batch on this worker (the engine halves it for a while after an OOM)
    # Seconds this worker spent on speculation alone (loading the draft model, measuring costs: plain
    # decoding does neither): charged once to the job's speculative side, so its measured speedup stays
    # honest for short jobs.
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
        target, draft_model, draft_seconds = load_job_models(spec, settings)
        draft = job_draft(spec)
        proposer: Proposer | None = DraftModel(draft_model) if draft_model is not None else None
        if spec.mode is DecodingMode.PROMPT_LOOKUP:
            proposer = PromptLookup(max_ngram=3)
        elif spec.mode is DecodingMode.AUTO:  # the cheapest first: it wins a tie
            job_outputs = SuffixLookup(SuffixCache(), max_ngram=3)
            proposer = ProposerMix(
                [PromptLookup(max_ngram=3), job_outputs, *([proposer] if proposer else [])]
            )
        gamma, k_max = _draft_length(spec), _k_max(spec)
        batch = _rows_per_batch(spec, settings)
        probe_every = spec.baseline_every if proposer is not None else 0
        costs, path, extra = None, None, draft_seconds
        if proposer is not None:
            misses = measured_costs.cache_info().misses
            costs, path = measured_costs(
                spec.model, draft, device, dtype, (1, batch), k_max + 1, settings.cost_cache_dir, models
            )
            fresh = measured_costs.cache_info().misses > misses  # (measure_seconds is 0 when read)
            extra += costs.measure_seconds if fresh else 0.0
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
        max_new_tokens = line_or_job(item.max_new_tokens, spec.max_new_tokens)
        ids = self.tokenizer(item.prompt)["input_ids"]
        too_long = context_problem(len(ids), max_new_tokens, self.context)
        if too_long is not None:
            raise PromptTooLong(too_long)
        seed = (spec.seed if spec.seed is not None else zlib.crc32(item.job_id.encode())) + item.seq
        if item.seed is not None:
            seed = item.seed & SEED_MASK  # OpenAI's seeds may be negative; the same seed, the same draws
        return Request(
            key=item.id if key is None else key,
            input_ids=ids,
            max_new_tokens=max_new_tokens,
            temperature=line_or_job(item.temperature, spec.temperature),
            top_p=line_or_job(item.top_p, spec.top_p),
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
        """Greedy speculative jobs decode 1 item in 1/F again without drafts (``JobSpec.lossless_every``)."""
        return self.spec.is_lossless_sample(seq)

    def text(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))


class RunnerCache:
    """Per-process cache of job runners (models themselves are cached by name in ``loading``); an
    evicted runner's caches are released (``JobRunner.release``), as at the end of each chunk.

    ``build`` makes a job's runner: ``JobRunner.build`` in production (``genjob.worker.chunks.PROCESS``);
    tests swap in a stand-in of the same ``Runner`` members (a fixture in-process;
    ``tests/doubles/scripted_worker.py`` in a test worker process)."""

    def __init__(self, build: Callable[..., Runner], size: int = MAX_CACHED_RUNNERS) -> None:
        self.build = build
        self._runners: OrderedDict[str, Runner] = OrderedDict()
        self._size = size
        self._lock = Lock()

    def get(self, job_id: str, spec: JobSpec, *, settings: Settings) -> Runner:
        with self._lock:
            runner = self._runners.get(job_id)
            if runner is None:
                started = time.perf_counter()
                runner = self.build(spec, settings=settings)
                note_runner_built(spec, time.perf_counter() - started, runner.setup_extra_s)
                self._runners[job_id] = runner
                while len(self._runners) > self._size:
                    _, evicted = self._runners.popitem(last=False)
                    evicted.release()
            self._runners.move_to_end(job_id)
            return runner


def result_row(
    runner: Runner, done: Finished, worker: str, lossless: bool | None, stop: list[str] | None = None
) -> dict[str, Any]:
    """An item's result row (``genjob.store.finish_items``): a value for each of ``RESULT_FIELDS``, the
    row's stats under their own names (``RowStats`` is named as the result's columns), its text cut at
    a stop string."""
    stats = done.stats
    measured = {stat.name: getattr(stats, stat.name) for stat in fields(stats) if stat.name in RESULT_FIELDS}
    row = {
        **measured,
        "output": cut_at_stop(runner.text(done.token_ids), stop),
        "mode": runner.spec.mode.value,
        "gamma_mean": round(stats.gamma_mean, 4),
        "lossless_match": lossless,
        "worker": worker,
        "proposer_counts": tallies_to_json(stats.by_proposer) or None,
        "looping": ends_in_a_loop(done.token_ids),
    }
    return {name: row[name] for name in RESULT_FIELDS}
