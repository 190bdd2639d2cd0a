"""A proposer's tally (mode auto): what it drafted for a row or a job, and its stored JSON form.

The engine's mix counts a ``ProposerTally`` per row and per job (``genjob.generation.proposer_mix``);
the worker stores a row's tallies flat, ``{'draft:rounds': n, 'draft:proposed': n, …}``
(``results.proposer_counts``, summed key by key into ``jobs.proposer_counts``), and the stats read them
back. Its own floor, below the core and generation both, so that each reads the one declaration.
Must not know: anything else of genjob (it imports nothing of it), torch, the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple, dataclass, fields


@dataclass
class ProposerTally:
    """Rounds a proposer drafted (for a row, or summed), tokens it proposed and had accepted, and the
    rounds whose first refused draft was tested (``rejections``: the failures of the per-token α)."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    rejections: int = 0

    def count_round(self, *, proposed: int, accepted: int, refused: bool) -> None:
        """One round drafted: ``proposed`` tokens offered, ``accepted`` kept, ``refused``: one was tested."""
        self.rounds += 1
        self.proposed += proposed
        self.accepted += accepted
        self.rejections += int(refused)


TALLY_FIELDS = tuple(field.name for field in fields(ProposerTally))


def tallies_to_json(tallies: Mapping[str, ProposerTally]) -> dict[str, int]:
    """Tallies by proposer as stored: flat ``name:field`` keys (``tables.PROPOSER_COUNTS``)."""
    return {
        f"{name}:{field}": value
        for name, tally in tallies.items()
        for field, value in zip(TALLY_FIELDS, astuple(tally), strict=True)
    }


def tallies_from_json(counts: Mapping[str, int] | None) -> dict[str, ProposerTally]:
    """Stored tallies (flat ``name:field`` keys) by proposer, in the order of their names; a field a
    stored tally lacks counts 0, one it does not know is passed over."""
    known: dict[str, dict[str, int]] = {}
    for key, value in sorted((counts or {}).items()):
        name, _, field = key.rpartition(":")
        counted = known.setdefault(name, {})
        if field in TALLY_FIELDS:
            counted[field] = int(value)
    return {name: ProposerTally(**counted) for name, counted in known.items()}
