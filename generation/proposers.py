"""Proposers: what guesses the next tokens of every row for the target to verify.

One small interface (``Proposer``), so a new proposer is one file: prompt lookup (n-grams from the
row's own prompt and output, here), a draft model (``genjob.generation.draft_model``), later a job-wide
suffix cache or EAGLE-style heads. A proposer sees the batch's rows and tensors and returns up to k
tokens per row; a row may get fewer (``counts``), and the engine never accepts more than that.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from genjob.generation.forward import to_device
from genjob.generation.requests import Row
from genjob.generation.sampling import RowSampling


@dataclass(frozen=True)
class BatchView:
    """The rows of a round (slot r = rows[r]) and their device state."""

    rows: list[Row]  # row r's cached tokens: len(rows[r].context) - 1, known on the host
    pending: torch.Tensor  # (B,) each row's last token, in no cache yet
    sampling: RowSampling
    positions: torch.Tensor  # (B,) output index of the first draft (= tokens generated so far)


@dataclass(frozen=True)
class Proposal:
    tokens: torch.Tensor  # (B, k) int64; past a row's count: padding, never accepted
    counts: list[int]  # proposals per row (≤ k), on the host
    probs: torch.Tensor | None  # (B, k, V) the distributions sampled from, or None (not sampled)


class Proposer(Protocol):
    """Guesses tokens for a batch. Slot operations mirror the engine's (rows are dense, 0..B-1)."""

    name: str

    def reserve(self, slots: int, capacity: int) -> None:
        """Room for ``slots`` rows of ``capacity`` tokens."""

    def admit(self, start: int, rows: list[Row], input_ids: torch.Tensor, lengths: torch.Tensor) -> None:
        """New rows in slots start.. : ``input_ids`` (n, L) right-padded, ``lengths`` (n,) real tokens.
        Every token but each row's last is prefilled by the engine's target at the same time."""

    def move(self, source: int, target: int, columns: int) -> None:
        """Slot ``source``'s row now lives in slot ``target``."""

    def available(self, rows: list[Row], k: int) -> list[int]:
        """How many tokens each row would get if asked for k (for the draft length choice)."""
        ...

    def propose(self, view: BatchView, k: int) -> Proposal:
        """Up to k tokens per row."""
        ...

    def advance(self, rows: list[Row], old_lengths: list[int], accepted: list[int], k: int) -> None:
        """The round is over: row r kept ``accepted[r]`` of its k proposals (plus the target's token)."""

    def release(self) -> None:
        """Drop any device memory (after an out-of-memory error)."""


class NgramIndex:
    """For one row: each n-gram (n ≤ max_n) of its tokens → the index of the token that followed its
    latest occurrence. Kept up to date as tokens are appended, so a lookup costs O(max_n)."""

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.follower: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # tokens [0, indexed) have had their preceding n-grams recorded

    def extend(self, context: list[int]) -> None:
        for end in range(max(self.indexed, 1), len(context)):  # context[end] follows the n-grams before it
            for n in range(1, self.max_n + 1):
                if end - n >= 0:
                    self.follower[tuple(context[end - n : end])] = end
        self.indexed = max(self.indexed, len(context))

    def lookup(self, context: list[int], k: int) -> list[int]:
        """The tokens that followed the latest earlier occurrence of the longest matching suffix."""
        self.extend(context)
        for n in range(min(self.max_n, len(context)), 0, -1):
            start = self.follower.get(tuple(context[-n:]))
            if start is not None:
                return context[start : start + k]
        return []


class PromptLookup:
    """Proposes the continuation of the latest earlier occurrence of the row's last n tokens (n = 3,
    2, 1) in its own prompt and output (prompt lookup decoding; vLLM's n-gram proposer). Free to run:
    no model, no device memory; its drafts are not sampled (a one-hot q)."""

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram

    def _guesses(self, rows: list[Row], k: int) -> list[list[int]]:
        guesses = []
        for row in rows:
            if row.ngrams is None:
                row.ngrams = NgramIndex(self.max_ngram)
            guesses.append(row.ngrams.lookup(row.context, k))
        return guesses

    def reserve(self, slots: int, capacity: int) -> None:
        pass

    def admit(self, start: int, rows: list[Row], input_ids: torch.Tensor, lengths: torch.Tensor) -> None:
        pass

    def move(self, source: int, target: int, columns: int) -> None:
        pass

    def available(self, rows: list[Row], k: int) -> list[int]:
        return [len(guess) for guess in self._guesses(rows, k)]

    def propose(self, view: BatchView, k: int) -> Proposal:
        guesses = self._guesses(view.rows, k)
        padded = [guess + [0] * (k - len(guess)) for guess in guesses]
        tokens = to_device(padded, view.pending.device).reshape(len(guesses), k)
        return Proposal(tokens=tokens, counts=[len(g) for g in guesses], probs=None)

    def advance(self, rows: list[Row], old_lengths: list[int], accepted: list[int], k: int) -> None:
        pass

    def release(self) -> None:
        pass
