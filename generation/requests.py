"""What the engine is asked to decode and what it gives back: token ids in, token ids out, with stats.

Per-row settings live on each ``Request`` (max new tokens, temperature, top-p, seed, EOS ids, a stop
check), so rows of one batch may differ in all of them. A row's ``RowStats`` are named as its result's
columns, which the worker fills from them by name; a proposer's tally is ``genjob.proposer_tally``'s
(the floor below generation and the core). Must not know: the database, Celery, HTTP, the core's
tables or options.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from genjob.proposer_tally import ProposerTally

# Given a row's new tokens so far, how many to keep if a stop sequence now appears in them (None: go on).
StopCheck = Callable[[list[int]], int | None]


@dataclass(frozen=True)
class Request:
    """One prompt to decode. ``key`` is the caller's handle, returned with the result."""

    key: int
    input_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    eos_ids: frozenset[int] = frozenset()
    stop: StopCheck | None = None
    draft_limit: int | None = None  # at most this many drafts accepted a round (0: plain decoding)

    def __post_init__(self) -> None:
        # checked here, not mid-batch: a bad request would otherwise cost its batch-mates their batch
        if not self.input_ids:
            raise ValueError(f"request {self.key}: empty input_ids (a prompt needs at least one token)")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.key}: max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.seed < 0:
            raise ValueError(f"request {self.key}: need temperature >= 0, 0 < top_p <= 1 and seed >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class RowStats:
    """What decoding one row took, named as its result's columns (``genjob.tables.Result``).
    ``target_rounds`` counts target forwards (the prefill is one: it yields the first token; each
    verification round yields accepted + 1), so new_tokens = target_rounds + draft_accepted.
    ``draft_rejections``: rounds whose first refused draft was tested (the failures of the per-token α).
    ``latency_s`` is the row's share of the batch's time (each round's time split evenly over its
    rows), so a job's summed latency is its decode time; ``wall_s`` is admission to finish."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    target_rounds: int = 0
    draft_proposed: int = 0
    draft_accepted: int = 0
    draft_rejections: int = 0
    gamma_sum: int = 0  # Σ over verification rounds of the γ the batch used
    latency_s: float = 0.0
    wall_s: float = 0.0
    finish_reason: str = "length"  # or "stop" (an EOS id or a stop sequence)
    by_proposer: dict[str, ProposerTally] = field(default_factory=dict)  # mode auto (``proposer_mix``)

    @property
    def gamma_mean(self) -> float:
        verify_rounds = self.target_rounds - 1
        return self.gamma_sum / verify_rounds if verify_rounds > 0 else 0.0


@dataclass(frozen=True)
class Finished:
    key: int
    token_ids: list[int]  # the new tokens only, without the prompt
    stats: RowStats


@dataclass(eq=False)
class Row:
    """A request being decoded: its tokens so far (the last one, ``tokens[-1]``, is in no cache yet).
    What the engine owns only: a proposer keeps its own state for the row, keyed by the row (compared
    and hashed by identity, ``proposers.RowState``)."""

    request: Request
    stats: RowStats
    tokens: list[int] = field(default_factory=list)
    admitted: float = 0.0
    successes: int = 0  # accepted drafts, for this row's acceptance estimate
    failures: int = 0  # rejections
    finished: bool = False

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - len(self.tokens)

    @property
    def context(self) -> list[int]:
        """Prompt and output: every token of the row."""
        return self.request.input_ids + self.tokens
