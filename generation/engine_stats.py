"""What the engine measured: rounds by draft length, plain probe rounds, prefill, per-row acceptance.

The worker takes these per chunk (``take``) and adds them to the job's sums, from which the job's
measured speedup, γ histogram and mean batch size are computed. The measured speedup compares rounds
of the same row count (``by_rows``, flat keys ``B:field``): every round's seconds and the output
tokens it made (a lossless check's plain twin rows excluded: a plain job would not decode them), and
apart, the plain rounds (k = 0: probe rounds and rounds that chose k = 0 alike, the same work) with
their tokens, seconds and Σ (seconds per token)² for an interval (``genjob.stats``).
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

from genjob.generation.requests import Row

PRIOR_WEIGHT = 4.0  # pseudo-observations pulling a new row's acceptance towards the batch's
PRIOR_SUCCESSES, PRIOR_FAILURES = 3.0, 2.0  # before anything is known: α ≈ 0.6


@dataclass
class EngineStats:
    rounds: int = 0  # verification rounds (probes included)
    rows_sum: int = 0  # Σ batch size over rounds (mean batch size = rows_sum / rounds)
    tokens: int = 0  # tokens the rounds produced
    seconds: float = 0.0  # time of the rounds
    probe_rounds: int = 0  # rounds decoded plainly for the measured speedup
    probe_tokens: int = 0
    probe_seconds: float = 0.0
    probe_sq: float = 0.0  # Σ over probe rounds of (seconds per token)², for a confidence interval
    gamma_hist: Counter[int] = field(default_factory=Counter)  # rounds by k (probes excluded)
    # row-rounds by the drafts the row had, m ≤ k (probes excluded): prompt lookup often has fewer than
    # k or none, and a row near its max_new_tokens can use fewer; the expected speedup counts these
    drafts_hist: Counter[int] = field(default_factory=Counter)
    proposed: int = 0
    accepted: int = 0
    rejections: int = 0
    prefill_rows: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    oom_events: int = 0
    # by row count B, flat keys ``B:field`` (``BY_ROWS_FIELDS``): what the measured speedup compares
    by_rows: dict[str, float] = field(default_factory=dict)
    # lifetime acceptance (never reset by ``take``): the prior of new rows
    successes_total: int = 0
    failures_total: int = 0

    def round(
        self,
        *,
        batch: int,
        k: int,
        probe: bool,
        tokens: int,
        seconds: float,
        proposed: int,
        accepted: int,
        rejections: int,
        drafts: list[int],
        check_tokens: int = 0,
    ) -> None:
        """One round of ``batch`` rows; ``check_tokens``: those of its tokens that went to rows decoded
        only to check the job's output (a lossless check's plain twins), not to the job's output."""
        added = {"rounds": 1.0, "seconds": seconds, "tokens": float(tokens - check_tokens)}
        if k == 0:  # a plain round (a probe, or k = 0 chosen): the plain pace at this row count
            added |= {
                "plain_rounds": 1.0,
                "plain_tokens": float(tokens),
                "plain_seconds": seconds,
                "plain_sq": (seconds / max(tokens, 1)) ** 2,
            }
        for name, value in added.items():
            key = f"{batch}:{name}"
            self.by_rows[key] = self.by_rows.get(key, 0.0) + value
        self.rounds += 1
        self.rows_sum += batch
        self.tokens += tokens
        self.seconds += seconds
        if probe:
            self.probe_rounds += 1
            self.probe_tokens += tokens
            self.probe_seconds += seconds
            self.probe_sq += (seconds / max(tokens, 1)) ** 2
        else:
            self.gamma_hist[k] += 1
            self.drafts_hist.update(drafts)
        self.proposed += proposed
        self.accepted += accepted
        self.rejections += rejections
        self.successes_total += accepted
        self.failures_total += rejections

    def prefill(self, *, rows: int, tokens: int, seconds: float) -> None:
        self.prefill_rows += rows
        self.prefill_tokens += tokens
        self.prefill_seconds += seconds

    def take(self) -> EngineStats:
        """A copy of the counters since the last ``take``, which are then reset (lifetime totals kept)."""
        taken = EngineStats(**{f.name: getattr(self, f.name) for f in fields(self)})
        taken.gamma_hist = Counter(self.gamma_hist)
        taken.drafts_hist = Counter(self.drafts_hist)
        taken.by_rows = dict(self.by_rows)
        for f in fields(self):
            if f.name not in ("successes_total", "failures_total"):
                setattr(self, f.name, type(getattr(self, f.name))())
        return taken


def acceptance_estimates(rows: list[Row], stats: EngineStats) -> list[float]:
    """Each row's per-token acceptance: its own successes / (successes + failures), pulled towards the
    batch's lifetime rate by ``PRIOR_WEIGHT`` pseudo-observations (a new row starts at the batch's)."""
    prior = (stats.successes_total + PRIOR_SUCCESSES) / (
        stats.successes_total + stats.failures_total + PRIOR_SUCCESSES + PRIOR_FAILURES
    )
    return [
        (row.successes + PRIOR_WEIGHT * prior) / (row.successes + row.failures + PRIOR_WEIGHT) for row in rows
    ]
