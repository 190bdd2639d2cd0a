"""What a round costs on this device, and the draft length that makes the most tokens per second.

``CostModel`` holds seconds of forwards measured on this device (``genjob.generation.cost_timing``): the
target's forward of q new tokens per row at a few batch sizes B and query lengths q, and the draft's
one-token step; between them it interpolates linearly (a plain step across every batch row measured,
its growth with q across the rows measured that far). A grid need not be complete: a worker starts
from a cheap prior (a few forwards at the batch size in use and at B = 1) and each measurement is
merged into what earlier processes kept (``merged``: a weighted mean per batch row, so a noisy one
counts less but is not thrown away). Live rounds keep it honest: a round also costs what the grid's
dummy forwards do not show (the host's own work, attention over the rows' real lengths, their ragged
K/V writes), so each observed round moves a live scale per draft length (measured ÷ predicted,
followed quickly downwards and slowly upwards, since noise only adds time), and that scale is kept too
for the next process. A scale, not an additive residual: what the grid misses grows with the batch,
and a k last run while the batch was small must still compare fairly with one run at a full batch. A k
not yet run borrows the scale of the nearest k that has run, and its own scale starts from there: only
the very first round of all is taken whole, so one stalled round can never make a draft length look
dear for good (a k that looks dear is not run again, so nothing would correct it).

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# The live scale follows a round that ran faster than it at once and a slower one only slowly: a busy
# host only ever adds time, so one stalled round must not make a draft length look dear for long (a k
# that looks dear is seldom run again, so its scale would stay high), while a lasting rise still shows
# within a few dozen rounds.
LIVE_DOWN, LIVE_UP = 0.3, 0.03
ROW_WEIGHT_CAP = 8.0  # a batch row's kept weight: a new measurement still moves it by ≥ 1/9
SCALE_WEIGHT_CAP = 256.0  # rounds behind a kept live scale: later processes still move it

NEAR_BEST = 0.9  # the suggested batch size: the fewest rows within 10 % of the best plain tokens/s


def _interpolate(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys), extrapolated linearly past the ends (xs ascending)."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 1e-9)


def _clamped(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys), held at the end values past the ends (xs ascending)."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    return _interpolate(xs, ys, x)


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
    # How much each batch row rests on: measurements merged into it (a busy one counts less), and the
    # largest q measured there (beyond it the row is extrapolated).
    row_weight: dict[int, float] = field(default_factory=dict)
    row_query: dict[int, int] = field(default_factory=dict)
    # Rounds behind each k's scale: kept ones (from the file) and this process's since last kept.
    scale_weight: dict[int, float] = field(default_factory=dict)
    scale_rounds: dict[int, int] = field(default_factory=dict)
    # What measuring took in this process (0 when everything was read), and whether its passes agreed
    # (``cost_timing``): a measurement taken while the machine was busy is kept with less weight.
    measure_seconds: float = 0.0
    steady: bool = True
    # The same forwards timed at a longer cache (``long.context``): a row's real cached length puts a
    # round between the two, linearly (attention and the K/V it reads grow with it; None: not measured).
    long: CostModel | None = None

    def __post_init__(self) -> None:
        for b in self.batch_sizes:
            self.row_weight.setdefault(b, 1.0)
            self.row_query.setdefault(b, self.query_lengths[-1])

    def covers(self, batch: int, max_query: int) -> bool:
        """Whether the rows measured serve ``batch`` up to ``max_query`` without measuring: a row at
        ``batch`` itself, or rows on both sides of it no more than a factor 2 apart (a grid)."""
        rows = [b for b in self.batch_sizes if self.row_query[b] >= max_query]
        below = [b for b in rows if b <= batch]
        above = [b for b in rows if b >= batch]
        return bool(below and above) and (batch in rows or min(above) <= 2 * max(below))

    def verify_seconds(self, batch: int, q: int, context: float | None = None) -> float:
        """A forward of q tokens per row at ``batch`` rows with ``context`` tokens cached per row (the
        grid's own ``context`` when None): the plain step at ``batch`` (from every batch row), times how
        much dearer q tokens are than one there (from the rows measured up to q), then placed between
        this grid and the long one by ``context`` (``_at_context``).

        A row measured only at q = 1 (the batch-size probe, ``_suggested`` in the worker) knows nothing
        of q > 1: extrapolated, it made q tokens cost q plain steps, and a grid of such rows around a
        job's batch size made every draft look dear (a demo job ran k = 0 in every round)."""
        short = self._verify_here(batch, q)
        if self.long is None or context is None:
            return short
        return self._at_context(short, self.long._verify_here(batch, q), context)

    def _verify_here(self, batch: int, q: int) -> float:
        plain = _interpolate(self.batch_sizes, [self._row_at(b, 1) for b in self.batch_sizes], batch)
        if q <= 1:
            return plain
        reach = max(self.row_query.values())
        covering = [b for b in self.batch_sizes if self.row_query[b] >= min(q, reach)]
        growth = [self._row_at(b, q) / self._row_at(b, 1) for b in covering]
        return plain * _clamped(covering, growth, batch)

    def _at_context(self, short: float, long: float, context: float) -> float:
        """Linear in the cached length through (``context``, short) and (``long.context``, long), never
        cheaper than the short grid's figure: noise that made the long forward faster means no growth."""
        assert self.long is not None
        growth = max(long - short, 0.0) / (self.long.context - self.context)
        return max(short + growth * (context - self.context), short * 0.5, 1e-9)

    def _row_at(self, batch: int, q: int) -> float:
        return _interpolate(self.query_lengths, self.verify[batch], q)

    def draft_seconds(self, batch: int, context: float | None = None) -> float:
        short = _interpolate(self.batch_sizes, [self.draft[b] for b in self.batch_sizes], batch)
        if self.long is None or context is None or not short:
            return short
        return self._at_context(short, self.long.draft_seconds(batch), context)

    def predicted(self, batch: int, k: int, context: float | None = None) -> float:
        """The model's seconds for a round: k draft steps and a verification of k+1 tokens per row, every
        row attending ``context`` cached tokens (the longest row's; the grid's own when None)."""
        return k * self.draft_seconds(batch, context) + self.verify_seconds(batch, k + 1, context)

    def round_seconds(self, batch: int, k: int, context: float | None = None) -> float:
        predicted = self.predicted(batch, k, context)
        return predicted * max(self.scale_for(k), 0.5)

    def scale_for(self, k: int) -> float:
        """k's live scale; for a k not yet run, that of the nearest k that has (the smaller one on a
        tie), or 1 before any round."""
        if k in self.scale:
            return self.scale[k]
        if not self.scale:
            return 1.0
        return self.scale[min(self.scale, key=lambda seen: (abs(seen - k), seen))]

    def observe(self, batch: int, k: int, seconds: float, context: float | None = None) -> None:
        """A live round of ``batch`` rows attending ``context`` cached tokens took ``seconds``:
        move k's scale towards measured ÷ predicted. The first round of all sets it; a k seen for the
        first time starts from its nearest neighbour's, so a single slow round moves it by only
        ``LIVE_UP`` of the gap."""
        ratio = seconds / self.predicted(batch, k, context)
        self.scale_rounds[k] = self.scale_rounds.get(k, 0) + 1
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
            **({"long": self.long.as_dict()} if self.long is not None else {}),
        }

    def to_json(self) -> dict[str, object]:
        """The measured grid in seconds, unrounded, with each row's weight and the live scale (and the
        rounds behind it), for ``from_json``."""
        return {
            "batch_sizes": self.batch_sizes,
            "query_lengths": self.query_lengths,
            "verify": {str(b): self.verify[b] for b in self.batch_sizes},
            "draft": {str(b): self.draft[b] for b in self.batch_sizes},
            "context": self.context,
            "row_weight": {str(b): self.row_weight[b] for b in self.batch_sizes},
            "row_query": {str(b): self.row_query[b] for b in self.batch_sizes},
            "scale": {str(k): [value, self.kept_scale_weight(k)] for k, value in sorted(self.scale.items())},
            **({"long": self.long.to_json()} if self.long is not None else {}),
        }

    def kept_scale_weight(self, k: int) -> float:
        return min(self.scale_weight.get(k, 0.0) + self.scale_rounds.get(k, 0), SCALE_WEIGHT_CAP)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CostModel:
        """What ``to_json`` wrote: nothing measured in this process (``measure_seconds`` 0)."""
        batches = [int(b) for b in data["batch_sizes"]]
        queries = [int(q) for q in data["query_lengths"]]
        verify = {b: [float(s) for s in data["verify"][str(b)]] for b in batches}
        if any(len(row) != len(queries) for row in verify.values()):
            raise ValueError("a verify row's length differs from the query lengths")
        draft = {b: float(data["draft"][str(b)]) for b in batches}
        weights, reach = data.get("row_weight", {}), data.get("row_query", {})
        scale = {int(k): (float(v), float(w)) for k, (v, w) in data.get("scale", {}).items()}
        return cls(
            batches,
            queries,
            verify,
            draft,
            int(data["context"]),
            scale={k: v for k, (v, _) in scale.items()},
            row_weight={b: float(weights.get(str(b), 1.0)) for b in batches},
            row_query={b: int(reach.get(str(b), queries[-1])) for b in batches},
            scale_weight={k: w for k, (_, w) in scale.items()},
            long=cls.from_json(data["long"]) if data.get("long") else None,
        )

    def merged(self, new: CostModel, *, weight: float) -> CostModel:
        """This (kept) model with ``new``'s batch rows merged in, each new row counting ``weight``: a
        weighted mean where both have a row (on the union of their query lengths, each row
        interpolated on its own and counted only up to the q it measured), ``new``'s scale and
        measuring time; nothing of ``self`` changes."""
        queries = sorted(set(self.query_lengths) | set(new.query_lengths))
        batches = sorted(set(self.batch_sizes) | set(new.batch_sizes))

        def row(model: CostModel, b: int) -> list[float]:
            return [_interpolate(model.query_lengths, model.verify[b], q) for q in queries]

        verify: dict[int, list[float]] = {}
        draft, row_weight, row_query = {}, {}, {}
        for b in batches:
            old_w = self.row_weight[b] if b in self.verify else 0.0
            new_w = weight if b in new.verify else 0.0
            olds = row(self, b) if old_w else [0.0] * len(queries)
            news = row(new, b) if new_w else [0.0] * len(queries)
            total = old_w + new_w
            old_reach, new_reach = self.row_query.get(b, 0), new.row_query.get(b, 0)
            verify[b] = []
            for q, o, n in zip(queries, olds, news, strict=True):
                # A row counts only up to the q it measured (beyond, its values are extrapolated),
                # unless neither reaches q.
                ow, nw = (old_w if q <= old_reach else 0.0), (new_w if q <= new_reach else 0.0)
                ow, nw = (ow, nw) if ow + nw else (old_w, new_w)
                verify[b].append((ow * o + nw * n) / (ow + nw))
            old_draft = self.draft.get(b, 0.0) if old_w else 0.0
            draft[b] = (old_w * old_draft + new_w * (new.draft.get(b, 0.0) if new_w else 0.0)) / total
            row_weight[b] = min(total, ROW_WEIGHT_CAP)
            row_query[b] = max(self.row_query.get(b, 0) if old_w else 0, new.row_query.get(b, 0))
        model = CostModel(
            batches, queries, verify, draft, self.context, row_weight=row_weight, row_query=row_query
        )
        model.scale, model.scale_weight = dict(self.scale), dict(self.scale_weight)
        model.measure_seconds, model.steady = new.measure_seconds, new.steady
        model.long = _merged_long(self.long, new.long, weight=weight)
        return model

    def with_scale_of(self, live: CostModel) -> CostModel:
        """This (kept) model with the live scale of ``live`` merged in, weighted by its rounds since
        it was last kept (``scale_rounds``); nothing of either changes."""
        model = CostModel.from_json(self.to_json())
        for k, rounds in live.scale_rounds.items():
            if not rounds or k not in live.scale:
                continue
            old_w, new_w = model.scale_weight.get(k, 0.0), float(min(rounds, SCALE_WEIGHT_CAP))
            old = model.scale.get(k, live.scale[k])
            model.scale[k] = (old_w * old + new_w * live.scale[k]) / (old_w + new_w)
            model.scale_weight[k] = min(old_w + new_w, SCALE_WEIGHT_CAP)
        return model


def _merged_long(kept: CostModel | None, new: CostModel | None, *, weight: float) -> CostModel | None:
    """The long grids merged as the short ones are; one measured at another length replaces the kept."""
    if kept is None or new is None or kept.context != new.context:
        return new if new is not None else kept
    return kept.merged(new, weight=weight)


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
    context: float | None = None,
) -> int:
    """The k maximising expected tokens per second for these rows (``acceptance`` a_i, ``room`` the
    most drafts row i can use: its proposals and its tokens left − 1); ``current`` unless another k
    is better by more than ``margin``. The margin guards only the way up: k = 0 (plain decoding) is
    taken as soon as it pays best, since a round spent drafting on a hunch is a loss nothing repays.
    ``context``: the rows' longest cached length, which the round's costs are priced at."""
    batch = len(acceptance)
    k_max = min(k_max, max(room, default=0))  # drafts nobody can use would be verified for nothing
    best_k, best, at_current = 0, -1.0, -1.0
    for k in range(k_max + 1):
        tokens = sum(expected_tokens(a, min(k, m)) for a, m in zip(acceptance, room, strict=True))
        goodput = tokens / costs.round_seconds(batch, k, context)
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


def suggested_batch_size(costs: CostModel) -> int:
    """The smallest measured B whose plain decoding gets within ``NEAR_BEST`` of the best tokens/s
    measured. Every B is weighed: a rule that stopped at the first B not worth its rows let one noisy
    step (a busy moment of a shared machine) cut a demo job from 64 rows to 4, at half the tokens/s."""
    rates = {b: b / costs.verify_seconds(b, 1) for b in costs.batch_sizes}
    best = max(rates.values())
    return min(b for b, rate in rates.items() if rate >= NEAR_BEST * best)
