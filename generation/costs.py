"""What a round costs on this device, and the draft length that makes the most tokens per second.

``CostModel.measure`` times the target's forward of q new tokens per row at a few batch sizes B
(powers of two) and query lengths q, at a representative cache length, and the draft's one-token
step, in several interleaved passes keeping each point's fastest time (a busy machine only ever adds
time, so a point dearer than a larger one takes the larger one's); between grid points it interpolates
linearly. Live rounds keep it honest: a round also costs what the grid's dummy forwards do not show (the
host's own work, attention over the rows' real lengths, their ragged K/V writes), so each observed round
moves a live scale per draft length (measured ÷ predicted, followed quickly downwards and slowly upwards,
since noise only adds time). A scale, not an additive residual: what the grid misses grows with the
batch, and a k last run while the batch was small must still compare fairly with one run at a full
batch. A k not yet run borrows the scale of the nearest k that has run, and its own scale starts from
there: only the very first round of all is taken whole, so one stalled round can never make a draft
length look dear for good (a k that looks dear is not run again, so nothing would correct it).

Goodput (the choice of γ, here k): row i with per-token acceptance a_i and room for m_i(k) drafts
yields E_i(k) = (1 − a_i^(m_i+1)) / (1 − a_i) tokens a round; a round costs k draft steps plus a
verification of k+1 tokens per row. ``choose_draft_length`` picks the k in 0..k_max maximising
Σ_i E_i(k) / seconds(B, k). k = 0 is plain decoding, so by the model's own measure a round is never
worse than plain decoding; a new k > 0 must beat the current one by a margin (hysteresis), while k = 0
is taken as soon as it pays best.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from genjob.generation.forward import cache_shapes, forward_rows
from genjob.generation.slot_cache import SlotCache

log = logging.getLogger(__name__)

# The live scale follows a round that ran faster than it at once and a slower one only slowly: a busy
# host only ever adds time, so one stalled round must not make a draft length look dear for long (a k
# that looks dear is seldom run again, so its scale would stay high), while a lasting rise still shows
# within a few dozen rounds.
LIVE_DOWN, LIVE_UP = 0.3, 0.03
SLOW_FORWARD_S = 0.5  # stop growing the grid's batch sizes past a forward this slow
STEADY_TOLERANCE = 0.15  # a measurement is steady when most points' two best passes agree this closely


def _interpolate(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys), extrapolated linearly past the ends (xs ascending)."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 1e-9)


@dataclass
class CostModel:
    """Seconds of forwards measured on this device: ``verify[B][q]`` for the target, ``draft[B]`` for a
    draft step (0 without a draft model), at ``context`` cached tokens per row."""

    batch_sizes: list[int]
    query_lengths: list[int]
    verify: dict[int, list[float]]
    draft: dict[int, float]
    context: int
    scale: dict[int, float] = field(default_factory=dict)  # live: measured ÷ predicted seconds, by k
    # What measuring took: in all, and on the points plain decoding needs too (q = 1, no draft).
    measure_seconds: float = 0.0
    plain_measure_seconds: float = 0.0
    # Whether the passes agreed (``_steady``): a measurement taken while the machine was busy is worth
    # using for this process, not worth keeping for others (``worker/cost_cache``).
    steady: bool = True

    def verify_seconds(self, batch: int, q: int) -> float:
        by_batch = [_interpolate(self.query_lengths, self.verify[b], q) for b in self.batch_sizes]
        return _interpolate(self.batch_sizes, by_batch, batch)

    def draft_seconds(self, batch: int) -> float:
        return _interpolate(self.batch_sizes, [self.draft[b] for b in self.batch_sizes], batch)

    def predicted(self, batch: int, k: int) -> float:
        """The model's seconds for a round: k draft steps and a verification of k+1 tokens per row."""
        return k * self.draft_seconds(batch) + self.verify_seconds(batch, k + 1)

    def round_seconds(self, batch: int, k: int) -> float:
        predicted = self.predicted(batch, k)
        return predicted * max(self.scale_for(k), 0.5)

    def scale_for(self, k: int) -> float:
        """k's live scale; for a k not yet run, that of the nearest k that has (the smaller one on a
        tie), or 1 before any round."""
        if k in self.scale:
            return self.scale[k]
        if not self.scale:
            return 1.0
        return self.scale[min(self.scale, key=lambda seen: (abs(seen - k), seen))]

    def observe(self, batch: int, k: int, seconds: float) -> None:
        """A live round of ``batch`` rows took ``seconds``: move k's scale towards measured ÷ predicted.
        The first round of all sets it; a k seen for the first time starts from its nearest neighbour's,
        so a single slow round moves it by only ``LIVE_UP`` of the gap."""
        ratio = seconds / self.predicted(batch, k)
        if not self.scale:
            self.scale[k] = ratio
            return
        old = self.scale_for(k)
        self.scale[k] = old + (LIVE_UP if ratio > old else LIVE_DOWN) * (ratio - old)

    def at_batch(self, batch: float, ks: Sequence[int]) -> dict[str, object]:
        """The costs at one batch size (ms): a plain step, a draft step, a verification of k+1 tokens."""
        b = max(1, round(batch))
        return {
            "batch": round(batch, 2),
            "plain_ms": round(self.verify_seconds(b, 1) * 1e3, 4),
            "draft_step_ms": round(self.draft_seconds(b) * 1e3, 4),
            "verify_ms": {str(k): round(self.verify_seconds(b, k + 1) * 1e3, 4) for k in sorted(ks)},
        }

    def as_dict(self) -> dict[str, object]:
        """The figures a job records (milliseconds), so users can redo the expected speedup by hand."""
        return {
            "context": self.context,
            "batch_sizes": self.batch_sizes,
            "query_lengths": self.query_lengths,
            "verify_ms": {str(b): [round(s * 1e3, 4) for s in self.verify[b]] for b in self.batch_sizes},
            "draft_step_ms": {str(b): round(self.draft[b] * 1e3, 4) for b in self.batch_sizes},
        }

    def to_json(self) -> dict[str, object]:
        """The measured grid in seconds, unrounded, for ``from_json`` (the live scale is not kept)."""
        return {
            "batch_sizes": self.batch_sizes,
            "query_lengths": self.query_lengths,
            "verify": {str(b): self.verify[b] for b in self.batch_sizes},
            "draft": {str(b): self.draft[b] for b in self.batch_sizes},
            "context": self.context,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CostModel:
        """A grid ``to_json`` wrote: nothing measured in this process (``measure_seconds`` 0)."""
        batches = [int(b) for b in data["batch_sizes"]]
        queries = [int(q) for q in data["query_lengths"]]
        verify = {b: [float(s) for s in data["verify"][str(b)]] for b in batches}
        if any(len(row) != len(queries) for row in verify.values()):
            raise ValueError("a verify row's length differs from the query lengths")
        draft = {b: float(data["draft"][str(b)]) for b in batches}
        return cls(batches, queries, verify, draft, int(data["context"]))

    @classmethod
    def measure(
        cls,
        target: PreTrainedModel,
        draft: PreTrainedModel | None,
        *,
        max_batch: int,
        max_query: int,
        context: int = 64,
        passes: int = 3,
    ) -> CostModel:
        """Time the grid: B = 1, 2, 4, … ≤ max_batch (stopping early once a forward takes over half a
        second), q = 1, 2, 3, 4, 6, 8, … ≤ max_query; each point's fastest of ``passes`` interleaved
        passes (three forwards each) after a warm-up pass, then made non-decreasing in q and in B."""
        queries = sorted({q for q in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if q <= max_query} | {max_query})
        batches = [1]
        while batches[-1] < max_batch:
            batches.append(min(2 * batches[-1], max_batch))
        started, plain_seconds = time.perf_counter(), 0.0
        timers = {b: _Timer(target, draft, b, queries[-1], context) for b in batches}
        verify = {b: [float("inf")] * len(queries) for b in batches}
        drafts = {b: float("inf") if draft is not None else 0.0 for b in batches}
        kept: dict[tuple[int, int], list[float]] = {}  # each target point's times, one per kept pass
        for number in range(passes + 1):  # pass 0 warms every shape up and is not kept
            for b in list(timers):
                if b not in timers:
                    continue
                timer = timers[b]
                for i, q in enumerate(queries):
                    point = time.perf_counter()
                    seconds = timer.target(q)
                    if i == 0:
                        plain_seconds += time.perf_counter() - point
                    if number:
                        verify[b][i] = min(verify[b][i], seconds)
                        kept.setdefault((b, i), []).append(seconds)
                if draft is not None:
                    drafts[b] = min(drafts[b], timer.draft()) if number else drafts[b]
                if number == 0 and seconds > SLOW_FORWARD_S:  # too slow to be worth batching further
                    for larger in [x for x in timers if x > b]:
                        del timers[larger], verify[larger], drafts[larger]
        batches = sorted(verify)
        # More tokens never cost less, and noise only ever adds time: a point dearer than a larger one
        # was slowed down, so each takes the least of itself and every larger point (in q, then in B).
        for b in batches:
            for i in range(len(queries) - 2, -1, -1):
                verify[b][i] = min(verify[b][i], verify[b][i + 1])
        for larger, smaller in itertools.pairwise(reversed(batches)):
            verify[smaller] = [min(a, c) for a, c in zip(verify[smaller], verify[larger], strict=True)]
            drafts[smaller] = min(drafts[smaller], drafts[larger])
        model = cls(batches, queries, verify, drafts, context)
        model.steady = _steady([times for (b, _), times in kept.items() if b in verify])
        model.measure_seconds = time.perf_counter() - started
        model.plain_measure_seconds = plain_seconds
        log.info("cost model: %s", model.as_dict())
        return model


def _steady(times_per_point: list[list[float]]) -> bool:
    """Whether, at most points, the two fastest passes lie within ``STEADY_TOLERANCE`` of each other: a
    machine that other work keeps busy makes the passes disagree."""
    gaps = sorted(sorted(times)[1] / sorted(times)[0] for times in times_per_point if len(times) > 1)
    return not gaps or gaps[len(gaps) // 2] <= 1 + STEADY_TOLERANCE


class _Timer:
    """Forwards of dummy tokens at ``context`` cached tokens per row, timed (a sync around each on GPU)."""

    def __init__(
        self, target: PreTrainedModel, draft: PreTrainedModel | None, batch: int, max_query: int, context: int
    ) -> None:
        self.batch, self.context = batch, context
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

    def target(self, q: int) -> float:
        return min(self._time(0, q) for _ in range(3))

    def draft(self) -> float:
        return min(self._time(1, 1) for _ in range(3))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def expected_tokens(acceptance: float, drafts: int) -> float:
    """Tokens a round yields with per-token acceptance a and ``drafts`` proposals: Σ_{j≤drafts} a^j."""
    if acceptance >= 1.0:
        return float(drafts + 1)
    return (1 - acceptance ** (drafts + 1)) / (1 - acceptance)


def choose_draft_length(
    costs: CostModel,
    acceptance: Sequence[float],
    room: Sequence[int],
    *,
    k_max: int,
    current: int,
    margin: float = 0.05,
) -> int:
    """The k maximising expected tokens per second for these rows (``acceptance`` a_i, ``room`` the
    most drafts row i can use: its proposals and its tokens left − 1); ``current`` unless another k
    is better by more than ``margin``. The margin guards only the way up: k = 0 (plain decoding) is
    taken as soon as it pays best, since a round spent drafting on a hunch is a loss nothing repays."""
    batch = len(acceptance)
    k_max = min(k_max, max(room, default=0))  # drafts nobody can use would be verified for nothing
    best_k, best, at_current = 0, -1.0, -1.0
    for k in range(k_max + 1):
        tokens = sum(expected_tokens(a, min(k, m)) for a, m in zip(acceptance, room, strict=True))
        goodput = tokens / costs.round_seconds(batch, k)
        if goodput > best:
            best_k, best = k, goodput
        if k == current:
            at_current = goodput
    keep = best <= at_current * (1 + margin) and not (best_k == 0 < current and best > at_current)
    if current <= k_max and at_current > 0 and keep:
        return current
    return best_k


def expected_speedup(
    costs: CostModel,
    alpha: float,
    gamma_hist: dict[int, int],
    batch: float,
    drafts_hist: dict[int, int] | None = None,
) -> float | None:
    """Leviathan et al.'s expected speedup with c generalised to the measured verify cost and each row's
    own number of drafts, over the rounds a job ran: Ē · t_plain(B) / (Σ_k n_k (k t_draft(B) +
    t_verify(B, k+1)) / Σ_k n_k), with n_k the rounds at draft length k, B the job's mean batch size and
    Ē = Σ_m r_m E(α, m) / Σ_m r_m the expected tokens of a row's round, r_m the row-rounds in which the
    row had m drafts (``drafts_hist``; m < k where prompt lookup found fewer, or a row had little room
    left). Without ``drafts_hist`` every row is taken to have had k, in batches of one size:
    Ē = Σ_k n_k E(α, k) / Σ_k n_k."""
    b = max(1, round(batch))
    rounds = sum(gamma_hist.values())
    if not rounds:
        return None
    per_row = drafts_hist if drafts_hist and sum(drafts_hist.values()) else gamma_hist
    rows = sum(per_row.values())
    tokens = sum(n * expected_tokens(alpha, m) for m, n in per_row.items()) / rows  # Ē
    spent = sum(n * costs.predicted(b, k) for k, n in gamma_hist.items()) / rounds
    return tokens * costs.verify_seconds(b, 1) / spent
