"""A job's recent pace, one reckoning for ``genjob wait``'s progress bar and ``genjob top``.

The pace is the change in the job's own counters (items finished, new tokens, drafts accepted and
proposed) between the oldest and the newest of the samples taken over the last ``RATE_WINDOW_S``
seconds; the ETA is what is left at that many items per second. A follower samples at each poll;
``top`` can also start from the job's results of the last ``RATE_WINDOW_S`` seconds (``seed``), so
its first frame already shows a rate. Must not know: the database, the workers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from genjob.tables import Job

RATE_WINDOW_S = 30.0


class Sample(NamedTuple):
    at: float  # seconds, on whatever clock the caller keeps (monotonic, epoch)
    items: int  # finished: done + failed
    tokens: int
    accepted: int
    proposed: int

    @classmethod
    def of(cls, job: Job, at: float) -> Sample:
        return cls(at, job.done + job.failed, job.new_tokens, job.draft_accepted, job.draft_proposed)


@dataclass(frozen=True)
class Rate:
    tokens_per_s: float
    items_per_s: float
    acceptance: float | None  # drafts accepted / proposed over the window; None if none proposed
    eta: timedelta | None  # at items_per_s; None when nothing finished in the window (or none left)


@dataclass
class Pace:
    """The samples of one job over the last ``RATE_WINDOW_S`` seconds (at least the last two)."""

    samples: deque[Sample] = field(default_factory=deque)

    def add(self, job: Job, now: float) -> None:
        self.samples.append(Sample.of(job, now))
        while len(self.samples) > 2 and now - self.samples[0].at > RATE_WINDOW_S:
            self.samples.popleft()

    def seed(self, job: Job, *, at: float, items: int, tokens: int, accepted: int, proposed: int) -> None:
        """Start from an earlier state of the job: its counters at ``at`` less what it finished since
        (``items``, ``tokens``, ``accepted``, ``proposed``: the sums of its results since ``at``)."""
        current = Sample.of(job, at)
        self.samples.appendleft(
            Sample(
                at,
                max(current.items - items, 0),
                max(current.tokens - tokens, 0),
                max(current.accepted - accepted, 0),
                max(current.proposed - proposed, 0),
            )
        )

    def rate(self, job: Job) -> Rate | None:
        """The pace between the oldest and newest samples; None before there are two."""
        if len(self.samples) < 2:
            return None
        first, last = self.samples[0], self.samples[-1]
        seconds = max(last.at - first.at, 1e-9)
        items_per_s = (last.items - first.items) / seconds
        proposed = last.proposed - first.proposed
        left = job.total - last.items
        return Rate(
            tokens_per_s=(last.tokens - first.tokens) / seconds,
            items_per_s=items_per_s,
            acceptance=(last.accepted - first.accepted) / proposed if proposed > 0 else None,
            eta=timedelta(seconds=round(left / items_per_s)) if items_per_s > 0 and left > 0 else None,
        )

    def fields(self, job: Job) -> dict[str, str]:
        """The progress bar's fields: ``400 tok/s``, ``α 75%``, ``ETA 0:00:35`` (empty when unknown)."""
        rate = self.rate(job)
        if rate is None:
            return {"rate": "", "accept": "", "eta": ""}
        return {
            "rate": f"{rate.tokens_per_s:,.0f} tok/s",
            "accept": f"α {rate.acceptance:.0%}" if rate.acceptance is not None else "",
            "eta": f"ETA {rate.eta}" if rate.eta is not None else "",
        }
