"""Batched assisted generation: B prompts per forward pass, greedy, lossless.

transformers' ``generate(assistant_model=...)`` takes one prompt at a time. Here B rows decode
together: each round the draft proposes γ tokens for every row (γ batched forwards of one token),
the target verifies all rows' γ+1 positions in one forward pass, and every row keeps its own
number of tokens. Token ids in, token ids out; nothing here knows Celery, the database or HTTP.

Acceptance (greedy). Row i enters a round with its last token p (not yet in any cache). The draft
proposes d_1..d_γ; the target reads [p, d_1..d_γ] and its argmaxes t_1..t_{γ+1}, where t_j is the
target's own choice after p, d_1..d_{j-1}. The row accepts a_i = the longest prefix with d_j = t_j
(capped so the row never passes its max_new_tokens) and appends d_1..d_{a_i}, t_{a_i+1}: a_i + 1
tokens, each the target's greedy choice given the tokens before it, so the output is the target's
plain greedy decode, only with fewer target passes.

Layout: B slots, each row at its own length (right padding, stale columns masked). Both caches
(target and draft) are a ``SlotCache``: per layer, preallocated K/V buffers (B, heads, capacity,
head_dim); row i holds the K/V of all its tokens but the last in columns 0..lengths_i-1. A forward
of q new tokens writes row i's K/V at columns lengths_i..lengths_i+q-1 (one indexed write per
layer, no concatenation), uses positions lengths_i + j (explicit ``position_ids``) and a 4-D mask
(B, 1, q, width) built here: query j of row i sees columns <= lengths_i + j, so transformers never
guesses positions from padding. After verification row i simply sets lengths_i += a_i + 1: the
rejected drafts' K/V stay behind as stale columns, masked, and are overwritten next round. We
chose this over the two layouts that keep one common length (left padding re-aligned by shifting
rows every round, or masked holes that pile up mid-sequence): nothing is copied per round (a
first version realigned with a gather per layer and spent ~20 % of its time there), attention
reads only up to the longest row, and a finished row's slot is simply refilled: the next
request is prefilled alone and its cache copied into the free slot, other rows untouched. Free
slots are dropped (one copy) only once no request is left.
The draft cache holds the same tokens. A row that accepted all γ drafts has d_γ in its output but
not in the draft's cache (d_γ was the draft's output, never its input), so each round the
draft's first forward reads [previous token, p] instead of [p], writing column lengths_i-1 again
for every row (recomputed draft K/V: only proposals depend on it, never the output).

Exactness. Each prompt is prefilled alone with exactly the inputs transformers' ``generate``
passes, so its cache and its first new token are bit-identical to plain greedy decoding. Later
logits come from wider matrix products (B·(γ+1) rows instead of 1) and masked attention over
stale columns, whose float sums round differently (CPU GEMMs are not row-invariant in M, exactly
as in transformers' own batch-1 assisted generation, which verifies γ+1 rows at once), so they
differ from plain decoding's by float noise (measured ≤ 1.2e-5 on the demo pair, the same as
transformers' assisted generation); the argmax could differ only where the top two logits are
closer than that. bench/batched_exactness.py measures both; docs/benchmarks.md has the numbers.

Stats per row (add up exactly): the prefill is a round of its own that yields the first token,
each verify round yields accepted + 1 tokens, so new_tokens = target_rounds + draft_accepted.
draft_proposed counts the drafts a row could accept that round (γ, or fewer near its
max_new_tokens); accepted ≤ proposed. At an EOS inside the accepted drafts the row stops there
and the EOS counts as the round's own target token. latency_s is the row's share of the batch's
wall time (each round's time split evenly over the rows in it, a prefill charged to its row),
so a job's Σ latency_s is its wall time and its tokens/s stays honest; wall_s is admission to
finish.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from genjob.generation.engine import Decoded, DecodeStats, cache_kwarg
from genjob.generation.slot_cache import SlotCache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchRequest:
    key: int  # the caller's handle, returned with the result
    input_ids: list[int]
    max_new_tokens: int

    def __post_init__(self) -> None:
        # checked here, not mid-batch: a bad request would otherwise cost its batch-mates their batch
        if not self.input_ids:
            raise ValueError(f"request {self.key}: empty input_ids (a prompt needs at least one token)")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.key}: max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class BatchDecodeStats(DecodeStats):
    wall_s: float = 0.0  # admission to finish (latency_s is the row's share of the batch's time)


@dataclass
class _Row:
    request: BatchRequest
    stats: BatchDecodeStats
    tokens: list[int] = field(default_factory=list)
    admitted: float = 0.0

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - len(self.tokens)


def _attention_mask(model: PreTrainedModel, allowed: torch.Tensor) -> torch.Tensor:
    """The boolean (B, 1, q, width) mask as this model's attention wants it."""
    implementation = model.config._attn_implementation
    if implementation == "sdpa":
        return allowed
    if implementation == "eager":  # additive
        zero = torch.zeros((), dtype=model.dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.finfo(model.dtype).min)
    raise NotImplementedError(f"batched decoding supports eager and sdpa attention, not {implementation!r}")


def forward_step(
    model: PreTrainedModel,
    cache: SlotCache,
    lengths: torch.Tensor,
    input_ids: torch.Tensor,
    max_positions: int | None = None,
) -> torch.Tensor:
    """One batched forward of (B, q) new tokens, row i's at positions lengths_i + 0..q-1; it sees
    its own first lengths_i cached columns and, causally, the new ones. Returns logits (B, q, V).

    Tokens past a row's end (drafts it can never accept) may index past a learned position table;
    they are never kept and only later tokens see them, so their positions are clamped."""
    b, q = input_ids.shape
    steps = torch.arange(q, device=input_ids.device)
    positions = lengths[:, None] + steps  # (B, q)
    width = int(lengths.max()) + q
    cursor = cache.cursor
    cursor.rows, cursor.columns, cursor.width = (
        torch.arange(b, device=steps.device)[:, None].expand(b, q),
        positions,
        width,
    )
    allowed = torch.arange(width, device=steps.device) <= positions[:, :, None]  # (B, q, width)
    if max_positions is not None:
        positions = positions.clamp(max=max_positions - 1)
    out = model(
        input_ids=input_ids,
        attention_mask=_attention_mask(model, allowed[:, None]),
        position_ids=positions,
        use_cache=True,
        **{cache_kwarg(model): cache},
    )
    return out.logits


def prefill(model: PreTrainedModel, input_ids: list[int]) -> tuple[int, DynamicCache]:
    """One prompt alone, with the inputs ``generate`` uses: its cache and its greedy next token."""
    ids = torch.tensor([input_ids], dtype=torch.long, device=model.device)
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        position_ids=torch.arange(ids.shape[1], device=ids.device)[None],
        use_cache=True,
        logits_to_keep=1,
        **{cache_kwarg(model): cache},
    )
    if not all(type(layer) is DynamicLayer for layer in cache.layers):
        raise NotImplementedError("batched decoding supports full-attention (DynamicLayer) caches only")
    return int(out.logits[0, -1].argmax()), cache


class _Batch:
    """The rows decoding together, one per slot of both caches (target, draft), which hold the
    same tokens: every row's tokens but its last (``pending``), ``lengths`` of them (the draft's
    column lengths-1, ``previous``, may be stale; the draft rewrites it each round)."""

    def __init__(self, gamma: int) -> None:
        self.gamma = gamma
        self.rows: list[_Row | None] = []
        self.caches: list[SlotCache] = []  # [target] or [target, draft]
        self.lengths = torch.zeros(0, dtype=torch.long)  # (B,): cached tokens = pending's position
        self.pending = torch.zeros(0, dtype=torch.long)  # (B,): last tokens, in no cache yet
        self.previous = torch.zeros(0, dtype=torch.long)  # (B,): the tokens before them

    def __len__(self) -> int:
        return sum(row is not None for row in self.rows)

    def add(self, rows: list[_Row], prefilled: list[list[DynamicCache]]) -> None:
        """Put new rows into free slots (growing the slots or the columns if needed)."""
        need = max(row.request.max_new_tokens + len(row.request.input_ids) for row in rows) + self.gamma + 1
        free = [slot for slot, row in enumerate(self.rows) if row is None]
        if not self.caches:
            self.caches = [SlotCache(cache, len(rows), need) for cache in prefilled[0]]
            self.rows = [None] * len(rows)
            self.lengths = torch.zeros(
                len(rows), dtype=torch.long, device=self.caches[0].layers[0].keys.device
            )
            self.pending = torch.zeros_like(self.lengths)
            self.previous = torch.zeros_like(self.lengths)
            free = list(range(len(rows)))
        elif len(free) < len(rows) or need > self.caches[0].capacity:
            grow = len(rows) - len(free) if len(free) < len(rows) else 0
            self._resize(list(range(len(self.rows))) + [-1] * grow, max(need, self.caches[0].capacity))
            free += list(range(len(self.rows) - grow, len(self.rows)))
        for slot, row, caches in zip(free, rows, prefilled, strict=False):
            for cache, source in zip(self.caches, caches, strict=True):
                cache.place(slot, source)
            self.rows[slot] = row
            self.lengths[slot] = len(row.request.input_ids)
            self.pending[slot] = row.tokens[-1]
            self.previous[slot] = row.request.input_ids[-1]

    def compact(self) -> None:
        """Drop free slots (once no request is left to fill them)."""
        keep = [slot for slot, row in enumerate(self.rows) if row is not None]
        if len(keep) < len(self.rows):
            self._resize(keep, self.caches[0].capacity)

    def _resize(self, slots: list[int], capacity: int) -> None:
        index = torch.tensor(slots, dtype=torch.long, device=self.lengths.device)
        for cache in self.caches:
            cache.resize(index, capacity)
        old_rows, kept = self.rows, index.clamp(min=0)
        self.rows = [old_rows[s] if s >= 0 else None for s in slots]
        self.lengths = torch.where(index >= 0, self.lengths[kept], 0)
        self.pending = torch.where(index >= 0, self.pending[kept], 0)
        self.previous = torch.where(index >= 0, self.previous[kept], 0)


# --- one round -----------------------------------------------------------------------------------


def draft_propose(
    draft: PreTrainedModel, batch: _Batch, gamma: int, max_positions: int | None
) -> torch.Tensor:
    """γ greedy draft tokens per row, (B, γ), in γ batched forwards.

    The first reads [previous, p] (B, 2) at positions lengths-1, lengths: a row that accepted all
    γ drafts last round has not given the draft its last draft token's K/V yet (it was the
    draft's own output, never its input), and rewriting that column for the other rows costs
    less than a separate catch-up pass. Then d_1..d_{γ-1}, one token each, at lengths + k."""
    tokens = torch.stack([batch.previous, batch.pending], 1)
    proposed = []
    for k in range(gamma):
        start = batch.lengths - 1 if k == 0 else batch.lengths + k
        logits = forward_step(draft, batch.caches[1], start, tokens, max_positions)
        tokens = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        proposed.append(tokens)
    return torch.cat(proposed, 1)


def verify(
    target: PreTrainedModel, batch: _Batch, drafts: torch.Tensor, max_positions: int | None
) -> torch.Tensor:
    """The target's greedy choice at each of the γ+1 positions, (B, γ+1), in one forward.

    Input [p, d_1..d_γ] (B, γ+1): t_j = argmax after p, d_1..d_{j-1}."""
    tokens = torch.cat([batch.pending[:, None], drafts], 1)
    return forward_step(target, batch.caches[0], batch.lengths, tokens, max_positions).argmax(-1)


def accepted_counts(drafts: torch.Tensor, chosen: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
    """a_i = longest prefix where d_j == t_j, at most ``limits`` (B,) (room left before max_new_tokens).

    drafts (B, γ), chosen (B, γ+1): cumprod of the matches is 1 up to the first miss."""
    matches = (drafts == chosen[:, : drafts.shape[1]]).long()
    return torch.minimum(matches.cumprod(1).sum(1), limits)


def decode_round(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    batch: _Batch,
    *,
    eos_token_id: int | None,
    max_positions: int | None,
) -> list[_Row]:
    """Draft γ, verify γ+1, append each row's a_i + 1 tokens; returns the rows that finished
    (their slots are freed)."""
    started = time.perf_counter()
    gamma, rows, members = batch.gamma, batch.rows, list(batch.rows)
    assert all(row is not None for row in rows), "compact or fill the batch before a round"
    limits = torch.tensor([min(gamma, row.remaining - 1) for row in rows], device=batch.lengths.device)
    if gamma:
        drafts = draft_propose(draft, batch, gamma, max_positions)
    else:
        drafts = batch.pending.new_zeros(len(rows), 0)
    chosen = verify(target, batch, drafts, max_positions)  # (B, γ+1)
    accepted = accepted_counts(drafts, chosen, limits)  # (B,)
    finished = []
    for slot, (row, tokens, a, limit) in enumerate(
        zip(rows, chosen.tolist(), accepted.tolist(), limits.tolist(), strict=True)
    ):
        new = tokens[: a + 1]  # d_1..d_a, t_{a+1} (d_j == t_j for j <= a)
        if eos_token_id is not None and eos_token_id in new:
            new = new[: new.index(eos_token_id) + 1]
        row.tokens += new
        row.stats.target_rounds += 1
        row.stats.draft_proposed += limit
        row.stats.draft_accepted += len(new) - 1
        if row.remaining == 0 or new[-1] == eos_token_id:
            finished.append(row)
            rows[slot] = None
    batch.lengths += accepted + 1  # the caches keep [p, d_1..d_a]; later columns are stale
    inputs = torch.cat([batch.pending[:, None], drafts], 1)
    batch.previous = inputs.gather(1, accepted[:, None])[:, 0]  # p or d_a: the last token kept in cache
    batch.pending = chosen.gather(1, accepted[:, None])[:, 0]  # t_{a+1}: next round's p
    share = (time.perf_counter() - started) / len(members)
    for row in members:
        row.stats.latency_s += share
    return finished


# --- the loop ------------------------------------------------------------------------------------


@torch.inference_mode()
def _admit(
    target: PreTrainedModel, draft: PreTrainedModel | None, request: BatchRequest
) -> tuple[_Row, list[DynamicCache]]:
    """Prefill one request alone on both models: its first token is the prefill round's."""
    started = time.perf_counter()
    first, target_cache = prefill(target, request.input_ids)
    caches = [target_cache] if draft is None else [target_cache, prefill(draft, request.input_ids)[1]]
    stats = BatchDecodeStats(prompt_tokens=len(request.input_ids), target_rounds=1)
    row = _Row(request=request, stats=stats, tokens=[first], admitted=started)
    stats.latency_s = time.perf_counter() - started
    return row, caches


def _decoded(row: _Row, eos_token_id: int | None) -> tuple[int, Decoded]:
    stats = row.stats
    stats.new_tokens = len(row.tokens)
    stats.finish_reason = "stop" if eos_token_id is not None and row.tokens[-1] == eos_token_id else "length"
    stats.wall_s = time.perf_counter() - row.admitted
    return row.request.key, Decoded(token_ids=row.tokens, stats=stats)


def speculative_decode_batch(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    requests: Iterable[BatchRequest],
    *,
    batch_size: int,
    draft_tokens: int = 5,
    eos_token_id: int | None = None,
) -> Iterator[tuple[int, Decoded]]:
    """Decode ``requests`` greedily, up to ``batch_size`` at a time; yields (key, Decoded) as rows finish.

    Requests are pulled lazily, one whenever a row frees its slot (continuous refill), so the
    caller may claim work as it goes. ``draft=None`` is plain batched greedy decoding (γ = 0).
    """
    if batch_size < 1 or draft_tokens < 0:
        raise ValueError(f"need batch_size >= 1 and draft_tokens >= 0, got {batch_size}, {draft_tokens}")
    gamma = draft_tokens if draft is not None else 0
    config = target.config
    max_positions = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    queue, batch, exhausted = iter(requests), _Batch(gamma), False
    while True:
        rows, prefilled = [], []
        while not exhausted and len(batch) + len(rows) < batch_size:
            request = next(queue, None)  # pulled only when a slot is free: continuous refill
            if request is None:
                exhausted = True
                break
            row, caches = _admit(target, draft, request)
            if row.remaining == 0 or row.tokens[-1] == eos_token_id:
                yield _decoded(row, eos_token_id)  # done at its prefill
            else:
                rows.append(row)
                prefilled.append(caches)
        with torch.inference_mode():
            if rows:
                batch.add(rows, prefilled)
            if exhausted:
                batch.compact()
            finished = (
                decode_round(target, draft, batch, eos_token_id=eos_token_id, max_positions=max_positions)
                if len(batch)
                else []
            )
        for row in finished:
            yield _decoded(row, eos_token_id)
        if exhausted and not len(batch):
            return
