"""Proposers: what guesses the next tokens of every row for the target to verify, and their contract.

One typed interface (``Proposer``) holding every member the engine and the mix use, so a new proposer
is one file: prompt lookup (n-grams from the row's own prompt and output, here), a draft model
(``genjob.generation.draft_model``), the job-wide suffix cache (``genjob.generation.suffix_cache``),
the per-row mix of them (``genjob.generation.proposer_mix``). A proposer sees the batch's rows and
tensors and returns up to k tokens per row; a row may get fewer (``counts``), and the engine never
accepts more than its cap. Whatever a proposer keeps per row (an n-gram index, its cache's length) it
keeps itself, keyed by the ``Row`` (``RowState``): the ``Row`` holds only what the engine owns.
``ModelFree`` gives a proposer without a model or device state the members that do not apply to it.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar
from weakref import WeakKeyDictionary

import torch

from genjob.generation.forward import to_device
from genjob.generation.requests import Row
from genjob.generation.sampling import RowSampling

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from genjob.generation.slot_cache import SlotCache

State = TypeVar("State")


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

    @property
    def model(self) -> PreTrainedModel | None:
        """The draft model it runs, if any: its cost identity (the engine's costs are measured with it,
        the cost cache keyed on it); None: model-free, its drafts cost only host time."""
        ...

    @property
    def cache(self) -> SlotCache | None:
        """Its K/V cache, if any (the engine's K/V budget counts it)."""
        ...

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

    def row_acceptance(self, rows: list[Row]) -> list[float | None]:
        """Each row's acceptance rate for this round's drafts, if the proposer knows better than the
        engine's estimate for the row (mode auto: its chosen proposer's); None: the engine's."""
        ...

    def propose(self, view: BatchView, k: int) -> Proposal:
        """Up to k tokens per row."""
        ...

    def advance(
        self, rows: list[Row], old_lengths: list[int], accepted: list[int], k: int, drafted: list[int]
    ) -> None:
        """The round is over: row r was given ``drafted[r]`` of its proposals (the engine's cap: at most
        k, its count and its room) and kept ``accepted[r]`` of them (plus the target's token)."""

    def add_output(self, tokens: Sequence[int]) -> None:
        """A finished row's new tokens, for a proposer that learns from the job's outputs (the caller
        adds them; the engine never does)."""

    def release(self) -> None:
        """Drop any device memory (after an out-of-memory error)."""


class RowState(Generic[State]):
    """A proposer's own state for each row, made on first use by ``new`` and gone with the row (keyed
    weakly by the ``Row`` itself): the ``Row`` never holds a proposer's state."""

    def __init__(self, new: Callable[[], State]) -> None:
        self._new = new
        self._states: WeakKeyDictionary[Row, State] = WeakKeyDictionary()

    def __call__(self, row: Row) -> State:
        state = self._states.get(row)
        if state is None:
            state = self._states[row] = self._new()
        return state

    def __setitem__(self, row: Row, state: State) -> None:
        self._states[row] = state

    def __len__(self) -> int:
        """How many live rows have a state."""
        return len(self._states)


class ModelFree:
    """The members of ``Proposer`` that do not apply to a proposer with no model and no device state:
    no cache to reserve, fill or move, no opinion on a row's acceptance, nothing to learn or release."""

    model: PreTrainedModel | None = None
    cache: SlotCache | None = None

    def reserve(self, slots: int, capacity: int) -> None:
        pass

    def admit(self, start: int, rows: list[Row], input_ids: torch.Tensor, lengths: torch.Tensor) -> None:
        pass

    def move(self, source: int, target: int, columns: int) -> None:
        pass  # any state is kept by row, not by slot

    def row_acceptance(self, rows: list[Row]) -> list[float | None]:
        return [None] * len(rows)

    def advance(
        self, rows: list[Row], old_lengths: list[int], accepted: list[int], k: int, drafted: list[int]
    ) -> None:
        pass

    def add_output(self, tokens: Sequence[int]) -> None:
        pass

    def release(self) -> None:
        pass


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


class PromptLookup(ModelFree):
    """Proposes the continuation of the latest earlier occurrence of the row's last n tokens (n = 3,
    2, 1) in its own prompt and output (prompt lookup decoding; vLLM's n-gram proposer). Free to run:
    no model, no device memory; its drafts are not sampled (a one-hot q). Each row's ``NgramIndex``
    is its own."""

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram
        self.ngrams = RowState(lambda: NgramIndex(self.max_ngram))

    def _guesses(self, rows: list[Row], k: int) -> list[list[int]]:
        return [self.ngrams(row).lookup(row.context, k) for row in rows]

    def available(self, rows: list[Row], k: int) -> list[int]:
        return [len(guess) for guess in self._guesses(rows, k)]

    def propose(self, view: BatchView, k: int) -> Proposal:
        guesses = self._guesses(view.rows, k)
        padded = [guess + [0] * (k - len(guess)) for guess in guesses]
        tokens = to_device(padded, view.pending.device).reshape(len(guesses), k)
        return Proposal(tokens=tokens, counts=[len(g) for g in guesses], probs=None)
