"""Mode auto: every proposer the job can have, and each row, each round, drafts from the one that pays it.

``ProposerMix`` is itself a ``Proposer``, so the engine is unchanged: it forwards the slot operations
to every proposer it holds (a draft model keeps its cache in step) and, in ``available``, picks for
each row the proposer with the most expected accepted tokens this round: Σ_{i≤n} α^i for the n tokens
that proposer has for the row and its acceptance α on this row (its recent accepted / (accepted +
refused) for that proposer, each round's evidence fading by ``DECAY``, pulled towards the proposer's
job-wide rate by ``ROW_PRIOR`` pseudo-observations; a proposer no row has tried starts at
``PRIOR_ALPHA``). A row where no proposer expects ``MIN_EXPECTED`` accepted tokens gets none (its k
is 0 while the others draft). Every ``EXPLORE_EVERY``-th round a row drafts from the other offering
proposer it has tried least, so no proposer's estimate goes stale, unless at its job-wide rate that
proposer expects less than ``EXPLORE_SHARE`` of what the row's choice does (a proposer the job has found
poor is not tried again by every row), once the job has tried it in ``EXPLORE_MIN_ROUNDS`` row-rounds: a
few refused drafts at a job's start found nothing out (a smollm2 extraction job refused prompt lookup's
first 7 and never tried it again; tried on, it was right 83 % of the time). Rows of one batch may so
draft from different proposers, verified in one target pass: ``propose`` runs each chosen proposer once
over the batch and takes each row's tokens from its own (with a sampled proposer among them, the
other rows' q is one-hot at their tokens, exactly what "not sampled" means to the acceptance rule).

What each row drafted from is counted in its ``RowStats.by_proposer`` (a ``ProposerTally`` per
proposer: rounds chosen, proposed, accepted, rejections, a row's drafts being the engine's cap of them,
``advance``'s ``drafted``), and the job-wide tallies in ``totals``. Each row's choice and evidence are
the mix's own (``RowChoice``). Must not know: the database, Celery, HTTP, the core
(``genjob.proposer_tally`` is the floor below it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from genjob.generation.engine_stats import PRIOR_WEIGHT as ROW_WEIGHT
from genjob.generation.forward import to_device
from genjob.generation.proposers import BatchView, Proposal, Proposer, RowState
from genjob.generation.requests import Row
from genjob.proposer_tally import ProposerTally

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from genjob.generation.slot_cache import SlotCache

PRIOR_ALPHA = 0.5  # a proposer nobody has tried yet: as likely to be right as wrong
PRIOR_WEIGHT = 2.0  # pseudo-observations behind a proposer's job-wide rate
ROW_PRIOR = 2.0  # pseudo-observations of the job-wide rate behind a row's own
DECAY = 0.7  # a row's evidence fades by this each round it drafts: what its text does now counts most
EXPLORE_EVERY = 8  # every 8th round of a row, a proposer with tokens to offer that it has tried least…
EXPLORE_SHARE = 0.5  # …if at its job-wide rate it expects half what the row's choice does…
EXPLORE_MIN_ROUNDS = 32  # …or the job has tried it in fewer row-rounds than this (whatever its rate)
MIN_EXPECTED = 0.25  # fewer expected accepted tokens than this: the row drafts nothing this round


def expected_accepted(alpha: float, n: int) -> float:
    """Σ_{i=1..n} α^i: the drafts a row accepts on average from n of them at per-token acceptance α."""
    return sum(alpha**i for i in range(1, n + 1))


@dataclass
class RowChoice:
    """The mix's state for one row: who drafts for it this round (None: nobody) and, per proposer, its
    recent [accepted, refused] (fading by ``DECAY``)."""

    proposer: str | None = None
    evidence: dict[str, list[float]] = field(default_factory=dict)


class ProposerMix:
    """A per-row choice among ``proposers`` (first = preferred on a tie: put the cheapest first)."""

    name = "auto"

    def __init__(self, proposers: Sequence[Proposer]) -> None:
        if not proposers:
            raise ValueError("a mix needs at least one proposer")
        self.proposers = {proposer.name: proposer for proposer in proposers}
        self.totals = {name: ProposerTally() for name in self.proposers}
        self.choices = RowState(RowChoice)
        self._ran: set[str] = set()  # who proposed this round (only they advance with its k)

    @property
    def model(self) -> PreTrainedModel | None:
        """The draft model among them, if any (the engine measures its costs)."""
        return next((p.model for p in self.proposers.values() if p.model is not None), None)

    @property
    def cache(self) -> SlotCache | None:
        """The draft model's cache among them, if any (the engine's K/V budget counts it)."""
        return next((p.cache for p in self.proposers.values() if p.cache is not None), None)

    def chosen(self, row: Row) -> str | None:
        """Who drafts for ``row`` this round (None: nobody), as ``available`` chose."""
        return self.choices(row).proposer

    def add_output(self, tokens: Sequence[int]) -> None:
        """A finished row's new tokens, for the proposers that learn from the job's outputs."""
        for proposer in self.proposers.values():
            proposer.add_output(tokens)

    # --- slots: every proposer keeps its own state in step ----------------------------------------------
    def reserve(self, slots: int, capacity: int) -> None:
        for proposer in self.proposers.values():
            proposer.reserve(slots, capacity)

    def admit(self, start: int, rows: list[Row], input_ids: torch.Tensor, lengths: torch.Tensor) -> None:
        for proposer in self.proposers.values():
            proposer.admit(start, rows, input_ids, lengths)

    def move(self, source: int, target: int, columns: int) -> None:
        for proposer in self.proposers.values():
            proposer.move(source, target, columns)

    def release(self) -> None:
        for proposer in self.proposers.values():
            proposer.release()

    # --- the choice --------------------------------------------------------------------------------------
    def job_alpha(self, name: str) -> float:
        tally = self.totals[name]
        return (tally.accepted + PRIOR_WEIGHT * PRIOR_ALPHA) / (
            tally.accepted + tally.rejections + PRIOR_WEIGHT
        )

    def row_alpha(self, row: Row, name: str) -> float:
        accepted, refused = self.choices(row).evidence.get(name, (0.0, 0.0))
        return (accepted + ROW_PRIOR * self.job_alpha(name)) / (accepted + refused + ROW_PRIOR)

    def row_acceptance(self, rows: list[Row]) -> list[float | None]:
        """Each row's acceptance for the proposer chosen for it this round (None: it drafts nothing), for
        the engine's choice of k: what this round's drafts are worth, not the row's mixed past. Over the
        row's whole life with that proposer (``RowStats.by_proposer``), pulled towards the proposer's
        job-wide rate by ``engine_stats.PRIOR_WEIGHT``, as the engine weighs a row of one proposer: a
        row that only ever drafts from prompt lookup gets prompt lookup's k. (The choice of proposer
        uses the fading ``evidence``, quick to leave one that stops paying; the k, steadier, does not.)"""
        estimates: list[float | None] = []
        for row in rows:
            chosen = self.chosen(row)
            if chosen is None:
                estimates.append(None)
                continue
            tally = row.stats.by_proposer.get(chosen, ProposerTally())
            prior = self.job_alpha(chosen)
            estimates.append(
                (tally.accepted + ROW_WEIGHT * prior) / (tally.accepted + tally.rejections + ROW_WEIGHT)
            )
        return estimates

    def available(self, rows: list[Row], k: int) -> list[int]:
        """Choose each row's proposer (``chosen``; None: no drafts) and say how many tokens it has."""
        offers = {name: proposer.available(rows, k) for name, proposer in self.proposers.items()}
        counts = []
        for r, row in enumerate(rows):
            best, best_gain, best_n = None, MIN_EXPECTED, 0
            for name in self.proposers:
                n = offers[name][r]
                gain = expected_accepted(self.row_alpha(row, name), n) if n else 0.0
                if gain > best_gain:
                    best, best_gain, best_n = name, gain, n
            if row.stats.target_rounds % EXPLORE_EVERY == 0:
                offering = [name for name in self.proposers if offers[name][r] and name != best]
                if offering:
                    other = min(
                        offering, key=lambda name: row.stats.by_proposer.get(name, ProposerTally()).rounds
                    )
                    worth = expected_accepted(self.job_alpha(other), offers[other][r])
                    untried = self.totals[other].rounds < EXPLORE_MIN_ROUNDS
                    if untried or worth >= EXPLORE_SHARE * best_gain:  # it might pay: see what the row does
                        best, best_n = other, offers[other][r]
            self.choices(row).proposer = best
            counts.append(best_n)
        return counts

    def propose(self, view: BatchView, k: int) -> Proposal:
        rows = view.rows
        b = len(rows)
        choices = [self.chosen(row) for row in rows]
        chosen = {name for name in choices if name is not None}
        self._ran = chosen
        tokens = view.pending.new_zeros(b, k)
        counts = [0] * b
        proposals = {name: self.proposers[name].propose(view, k) for name in chosen}
        mine = {name: [r for r, choice in enumerate(choices) if choice == name] for name in chosen}
        # through pinned memory, non-blocking: a torch.tensor(..., device=) here waited for the queued drafts
        index = {name: to_device(slots, tokens.device) for name, slots in mine.items()}
        for name, proposal in proposals.items():
            tokens[index[name]] = proposal.tokens[index[name]]
            for r in mine[name]:
                counts[r] = proposal.counts[r]
        probs = None
        sampled = [proposal.probs for proposal in proposals.values() if proposal.probs is not None]
        if sampled:  # one sampled proposer among them: the others' q is one-hot at their tokens
            probs = torch.nn.functional.one_hot(tokens, sampled[0].shape[-1]).to(sampled[0].dtype)
            for name, proposal in proposals.items():
                if proposal.probs is not None:
                    probs[index[name]] = proposal.probs[index[name]]
        return Proposal(tokens=tokens, counts=counts, probs=probs)

    def advance(
        self, rows: list[Row], old_lengths: list[int], accepted: list[int], k: int, drafted: list[int]
    ) -> None:
        """Each proposer advances with the round's k if it proposed, else with 0 (it drafted nothing),
        given the drafts of the rows it drafted for (0 for the others); the chosen proposer's tallies,
        the row's and the job's, count what the row was given (``drafted``, the engine's cap) and
        accepted."""
        choices = [self.choices(row) for row in rows]
        for name, proposer in self.proposers.items():
            own = [n if choice.proposer == name else 0 for n, choice in zip(drafted, choices, strict=True)]
            proposer.advance(rows, old_lengths, accepted, k if name in self._ran else 0, own)
        if k and self._ran:
            for row, choice, a, limit in zip(rows, choices, accepted, drafted, strict=True):
                if choice.proposer is None or limit == 0:
                    continue
                refused = 1 if a < limit else 0
                evidence = choice.evidence.setdefault(choice.proposer, [0.0, 0.0])
                evidence[0] = evidence[0] * DECAY + a
                evidence[1] = evidence[1] * DECAY + refused
                for tally in (
                    row.stats.by_proposer.setdefault(choice.proposer, ProposerTally()),
                    self.totals[choice.proposer],
                ):
                    tally.count_round(proposed=limit, accepted=a, refused=bool(refused))
        self._ran = set()
