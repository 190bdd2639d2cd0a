"""Timing a device's forwards into a ``CostModel``: the thorough grid and the cheap prior a job starts from.

``measure_grid`` (``genjob calibrate``, the benchmarks) times B = 1, 2, 4, … ≤ max_batch and q = 1, 2,
3, 4, 6, 8, … ≤ max_query in several interleaved passes, each point's fastest; ``quick_prior`` times
only the batch sizes a job needs (the one in use and B = 1) at a few q, twice each after a warm-up
forward (at the long cache, q = 1 and the largest once each): a few seconds for a small model on a CPU
at most, so a job decodes from its first round and the live scale (``CostModel.observe``) learns the
rest. Both time dummy tokens at a short cache
(``context``, 64 tokens) and again at a long one (``LONG_CONTEXT``, or what the model's context allows),
so a round is priced at its rows' real cached length (``CostModel.long``: a verification's attention and
the K/V it reads grow with it, a plain step's most, so pricing every round at 64 tokens made long drafts
look cheap or dear by the prompt); a sync around each forward on a GPU; the points are made
non-decreasing in q and in B (noise only ever adds time, so a point dearer than a larger one takes the
larger one's).
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from genjob.generation.costs import CostModel
from genjob.generation.forward import cache_shapes, forward_rows, max_positions
from genjob.generation.slot_cache import SlotCache

log = logging.getLogger(__name__)

SLOW_FORWARD_S = 0.5  # stop growing the grid's batch sizes past a forward this slow
STEADY_TOLERANCE = 0.15  # a measurement is steady when most points' two best passes agree this closely
GRID_QUERIES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
PRIOR_QUERIES = (1, 2)  # and the job's largest: linear in between
SHORT_CONTEXT = 64  # cached tokens per row of the grid's forwards…
LONG_CONTEXT = 512  # …and of the long grid's (rows of real jobs hold hundreds), less where the model stops


def grid_batches(max_batch: int) -> list[int]:
    """1, 2, 4, … up to ``max_batch`` (included)."""
    batches = [1]
    while batches[-1] < max_batch:
        batches.append(min(2 * batches[-1], max_batch))
    return batches


def measure_grid(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    *,
    max_batch: int,
    max_query: int,
    context: int = SHORT_CONTEXT,
    passes: int = 3,
) -> CostModel:
    """The thorough grid: every B of ``grid_batches`` (stopping early once a forward takes over half a
    second), q in ``GRID_QUERIES`` ≤ max_query and max_query; each point's fastest of ``passes``
    interleaved passes of three forwards, after a warm-up pass."""
    queries = sorted({q for q in GRID_QUERIES if q <= max_query} | {max_query})
    batches = grid_batches(max_batch)
    return measure(target, draft, batches=batches, queries=queries, passes=passes, repeats=3, context=context)


def quick_prior(
    target: PreTrainedModel, draft: PreTrainedModel | None, *, batches: Sequence[int], max_query: int
) -> CostModel:
    """The cheap prior for ``batches`` (the job's and B = 1): q in ``PRIOR_QUERIES`` ≤ max_query and
    max_query, the faster of two forwards each after a warm-up; at the long cache q = 1 and max_query
    only, one forward each after a warm-up (the long grid says how a round grows with the cached length,
    linear between its two points; timing it whole doubled what a cold worker's first job paid). A
    prior of q = 1 alone (the worker's batch-size probe, up to B = 64) times no long grid: it prices
    no drafts, and timing B = 64 at the long cache doubled a cold worker's start."""
    queries = sorted({q for q in PRIOR_QUERIES if q <= max_query} | {max_query})
    return measure(
        target,
        draft,
        batches=sorted(set(batches)),
        queries=queries,
        passes=1,
        repeats=2,
        drop_slow=False,
        long=max_query > 1,
        long_queries=sorted({1, max_query}),
    )


def measure(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    *,
    batches: Sequence[int],
    queries: Sequence[int],
    passes: int,
    repeats: int,
    context: int = SHORT_CONTEXT,
    drop_slow: bool = True,
    long: bool = True,
    long_queries: Sequence[int] | None = None,
) -> CostModel:
    """Time ``queries`` at ``batches`` (ascending): a warm-up pass, then ``passes`` interleaved passes
    of ``repeats`` forwards per point, each point's fastest kept; with ``drop_slow``, larger batches
    are dropped once a forward takes over ``SLOW_FORWARD_S`` in the warm-up. With ``long``, the batches
    kept are timed again at ``long_context`` cached tokens (``CostModel.long``): at ``long_queries``
    (``queries`` when None), one forward per point and pass where those are given."""
    started = time.perf_counter()
    model = _measure_at(target, draft, batches, queries, passes, repeats, context, drop_slow)
    longest = long_context(target, draft, context, queries[-1]) if long else None
    if longest is not None:
        at, times = (queries, repeats) if long_queries is None else (long_queries, 1)
        model.long = _measure_at(target, draft, model.batch_sizes, at, passes, times, longest, False)
        model.steady = model.steady and model.long.steady
    model.measure_seconds = time.perf_counter() - started
    log.info("cost model: measured in %.2f s: %s", model.measure_seconds, model.as_dict())
    return model


def long_context(
    target: PreTrainedModel, draft: PreTrainedModel | None, context: int, max_query: int
) -> int | None:
    """The long grid's cached length: ``LONG_CONTEXT``, or less where a model's context ends sooner
    (None where it leaves no more than twice the short grid's, too close to tell growth from noise)."""
    limits = [max_positions(model) for model in (target, draft) if model is not None]
    room = min([LONG_CONTEXT, *(limit - max_query - 1 for limit in limits if limit)])
    return room if room >= 2 * context else None


def _measure_at(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    batches: Sequence[int],
    queries: Sequence[int],
    passes: int,
    repeats: int,
    context: int,
    drop_slow: bool,
) -> CostModel:
    """One grid at ``context`` cached tokens per row (``measure``)."""
    timers = {b: _Timer(target, draft, b, queries[-1], context, repeats) for b in batches}
    verify = {b: [float("inf")] * len(queries) for b in batches}
    drafts = {b: float("inf") if draft is not None else 0.0 for b in batches}
    kept: dict[tuple[int, int], list[float]] = {}  # each target point's times, one per kept pass
    for number in range(passes + 1):  # pass 0 warms every shape up and is not kept
        for b in list(timers):
            if b not in timers:
                continue
            timer = timers[b]
            for i, q in enumerate(queries):
                seconds = timer.target(q, 1 if number == 0 else timer.repeats)
                if number:
                    verify[b][i] = min(verify[b][i], seconds)
                    kept.setdefault((b, i), []).append(seconds)
            if draft is not None and number:
                drafts[b] = min(drafts[b], timer.draft(timer.repeats))
            elif draft is not None:
                timer.draft(1)  # the warm-up
            if drop_slow and number == 0 and seconds > SLOW_FORWARD_S:  # too slow to batch further
                for larger in [x for x in timers if x > b]:
                    del timers[larger], verify[larger], drafts[larger]
    measured = sorted(verify)
    for b in measured:
        for i in range(len(queries) - 2, -1, -1):
            verify[b][i] = min(verify[b][i], verify[b][i + 1])
    for larger, smaller in itertools.pairwise(reversed(measured)):
        verify[smaller] = [min(a, c) for a, c in zip(verify[smaller], verify[larger], strict=True)]
        drafts[smaller] = min(drafts[smaller], drafts[larger])
    model = CostModel(measured, list(queries), verify, drafts, context)
    model.steady = _steady([times for (b, _), times in kept.items() if b in verify])
    return model


def _steady(times_per_point: list[list[float]]) -> bool:
    """Whether, at most points, the two fastest passes lie within ``STEADY_TOLERANCE`` of each other: a
    machine that other work keeps busy makes the passes disagree (one pass: nothing to compare)."""
    gaps = sorted(sorted(times)[1] / sorted(times)[0] for times in times_per_point if len(times) > 1)
    return not gaps or gaps[len(gaps) // 2] <= 1 + STEADY_TOLERANCE


class _Timer:
    """Forwards of dummy tokens at ``context`` cached tokens per row, timed (a sync around each on GPU)."""

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | None,
        batch: int,
        max_query: int,
        context: int,
        repeats: int,
    ) -> None:
        self.batch, self.context, self.repeats = batch, context, repeats
        self.models = [(target, self._cache(target, max_query))]
        if draft is not None:
            self.models.append((draft, self._cache(draft, 1)))

    def _cache(self, model: PreTrainedModel, q: int) -> SlotCache:
        cache = SlotCache(cache_shapes(model), dtype=model.dtype, device=model.device)
        cache.reserve(self.batch, self.context + q)
        return cache

    @torch.inference_mode()
    def _time(self, index: int, q: int) -> float:
        model, cache = self.models[index]
        tokens = torch.zeros(self.batch, q, dtype=torch.long, device=model.device)
        _synchronize(model.device)
        started = time.perf_counter()
        forward_rows(model, cache, (0, self.batch), [self.context] * self.batch, tokens)
        _synchronize(model.device)
        return time.perf_counter() - started

    def target(self, q: int, times: int) -> float:
        return min(self._time(0, q) for _ in range(times))

    def draft(self, times: int) -> float:
        return min(self._time(1, 1) for _ in range(times))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
