"""The draft-model proposer: a small LM sharing the target's tokenizer guesses k tokens per row.

It keeps its own ``SlotCache`` with the same slots as the target's, and for each row how many of its
tokens that cache holds (``cached``, the proposer's own per-row state). Row r's draft cache holds its
first ``cached_r`` tokens; the target's holds ``lengths_r`` (all but the pending token). They
differ after a round that accepted every draft (d_k was the draft's output, never its input: a lag
of 1) and after rounds without drafts (γ = 0 costs no draft step: the lag grows by one each). The
first draft step therefore reads each row's missing tokens and its pending token, right-padded:
[tokens cached_r..lengths_r] at positions cached_r.. (usually 1 or 2 tokens), and keeps the
logits of the pending one; each later step reads the previous draft at lengths_r + j.
Sampling rows sample their drafts from the draft's processed distribution q (kept for the
acceptance test); greedy rows take its argmax.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from genjob.generation.forward import cache_shapes, forward_rows, to_device
from genjob.generation.proposers import BatchView, Proposal, RowState
from genjob.generation.requests import Row
from genjob.generation.sampling import sample_draft_token
from genjob.generation.slot_cache import SlotCache


class DraftModel:
    """A ``Proposer`` drafting with ``model``: its model is its cost identity, its cache counts in the
    engine's K/V budget."""

    name = "draft"

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.cache = SlotCache(cache_shapes(model), dtype=model.dtype, device=model.device)
        self.cached = RowState(int)  # each row's tokens in the draft cache (cached_r)

    def reserve(self, slots: int, capacity: int) -> None:
        self.cache.reserve(slots, capacity)

    @torch.inference_mode()
    def admit(self, start: int, rows: list[Row], input_ids: torch.Tensor, lengths: torch.Tensor) -> None:
        """Prefill the prompts (every token but the last, as the target does) into slots start.."""
        zero = [0] * len(rows)
        forward_rows(self.model, self.cache, (start, start + len(rows)), zero, input_ids, last=lengths - 1)
        for row in rows:
            self.cached[row] = len(row.context) - 1

    def move(self, source: int, target: int, columns: int) -> None:
        self.cache.move(source, target, columns)

    def available(self, rows: list[Row], k: int) -> list[int]:
        return [k] * len(rows)

    def row_acceptance(self, rows: list[Row]) -> list[float | None]:
        return [None] * len(rows)  # the engine's estimate for each row

    @torch.inference_mode()
    def propose(self, view: BatchView, k: int) -> Proposal:
        rows, device = view.rows, view.pending.device
        b = len(rows)
        starts = [self.cached(row) for row in rows]
        # the missing tokens + the pending one
        chunks = [row.context[start:] for row, start in zip(rows, starts, strict=True)]
        width = max(len(chunk) for chunk in chunks)
        first = to_device([chunk + [0] * (width - len(chunk)) for chunk in chunks], device)
        last = to_device([len(chunk) - 1 for chunk in chunks], device)
        logits = forward_rows(self.model, self.cache, (0, b), starts, first, last=last)
        ends = [len(row.context) - 1 for row in rows]  # each row's pending position
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        for j in range(k):
            token, q = sample_draft_token(logits, view.sampling, view.positions + j)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            if j + 1 < k:
                at = [end + j + 1 for end in ends]
                logits = forward_rows(self.model, self.cache, (0, b), at, token[:, None])[:, 0]
        return Proposal(
            tokens=torch.stack(tokens, 1), counts=[k] * b, probs=torch.stack(probs, 1) if probs else None
        )

    def advance(
        self, rows: list[Row], old_lengths: list[int], accepted: list[int], k: int, drafted: list[int]
    ) -> None:
        """The draft cache is right up to the pending token and the accepted drafts it read (d_1..d_{k-1})."""
        if k == 0:
            return
        for row, length, a in zip(rows, old_lengths, accepted, strict=True):
            self.cached[row] = length + min(a, k - 1) + 1

    def add_output(self, tokens: Sequence[int]) -> None:
        pass  # a draft model learns nothing from the job's outputs

    def release(self) -> None:
        self.cache.release()
