"""Stats maths of a job, from the sums stored on its row; every figure one a user can check.

- acceptance rate = draft tokens accepted / proposed;
- α, the per-token acceptance of Leviathan et al.'s formula = accepted / (accepted + rejections):
  each round is a run of accepted drafts ended by one rejection (or by running out of drafts), so
  this is the rate that explains the observed runs;
- measured speedup = the job's tokens/s ÷ plain tokens/s on the same workers, at the same batch size
  (``speedup_by_rows``): the job's rounds are grouped by their row count B; the plain rounds among
  them (every ``1/F``-th round a probe, and the rounds that chose k = 0: the same work) give the plain
  seconds per token at that B where it has ``MIN_PACE_ROUNDS`` of them, else pooled over B's bin
  [2^j, 2^(j+1)) and moved to B along a line a + c·B fitted to every plain round's time, else that line
  itself; the job's output tokens of that B times it estimate what plain decoding would have spent on
  them (a ragged tail's rounds of one row are set against plain rounds of one row, and weigh what they
  took). Everything else the workers spent (prefill, bookkeeping) counts the same either way, except
  what only speculation spends (measuring costs, a lossless check's plain twins: their tokens are no
  output): that is the job's cost. With a 95 % interval from the spread of the plain rounds; none, and
  a note saying so, below ``MIN_PLAIN_ROUNDS`` plain rounds or where less than ``MIN_COVERED`` of the
  rounds' time has a pace of its row count or bin (the rest on the line alone);
- tokens/s two ways: wall-clock (``elapsed_tokens_per_second``) = new tokens / (started → finished,
  or → now while it runs), what the job delivered, as the ``job_stats`` view has it; decoding
  (``tokens_per_second``) = new tokens / the items' generate seconds (each item's share of its
  batch's time), the models' pace with queueing, model loading and gaps left out;
- per proposer (mode auto): its ``ProposerTally``, the rounds it drafted for a row, the tokens it
  proposed, those accepted and its rejections, so its own acceptance is accepted / proposed;
- expected speedup: computed by the worker from α, the rounds at each draft length k and the costs it
  measured at the job's mean batch size (``genjob.generation.costs.expected_speedup``), stored.
Must not know: the database session, torch, Celery.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from genjob.proposer_tally import ProposerTally, tallies_from_json
from genjob.tables import Job, utcnow

Z95 = 1.96


@dataclass(frozen=True)
class JobStats:
    acceptance_rate: float | None
    alpha: float | None
    mean_accepted_per_round: float | None
    tokens_per_second: float | None
    elapsed_seconds: float | None
    elapsed_tokens_per_second: float | None
    mean_batch_size: float | None
    measured_speedup: float | None
    measured_speedup_low: float | None
    measured_speedup_high: float | None
    expected_speedup: float | None
    lossless_rate: float | None
    proposers: dict[str, ProposerTally] | None = None  # mode auto: per proposer, its tally
    measured_speedup_note: str | None = None  # why there is no measured speedup ("too few probe rounds")


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


MIN_PLAIN_ROUNDS = 4  # fewer plain rounds in the job: no measured speedup ("too few probe rounds")
MIN_PACE_ROUNDS = 3  # a row count's (or its bin's) own plain pace rests on at least this many rounds
MIN_COVERED = 0.5  # nor where less of the rounds' seconds have a plain pace in their row count's bin


@dataclass(frozen=True)
class Measured:
    """The measured speedup with its 95 % interval, or None and ``note`` saying why."""

    speedup: float | None
    low: float | None = None
    high: float | None = None
    note: str | None = None


@dataclass
class _Pace:
    """Plain rounds pooled: their count, tokens, seconds and Σ (seconds per token)²."""

    rounds: float = 0.0
    tokens: float = 0.0
    seconds: float = 0.0
    sq: float = 0.0

    def add(self, other: _Pace) -> None:
        self.rounds += other.rounds
        self.tokens += other.tokens
        self.seconds += other.seconds
        self.sq += other.sq

    @property
    def per_token(self) -> float:
        return self.seconds / self.tokens

    @property
    def relative_variance(self) -> float | None:
        """Of the mean seconds per token (the spread of the rounds' own, over their count)."""
        n = self.rounds
        if n < 2:
            return None
        mean = self.per_token
        spread = max(self.sq / n - mean**2, 0.0) * n / (n - 1)
        return spread / mean**2 / n


def _bin(rows: int) -> int:
    """Row counts pooled where one has no plain round of its own: [1], [2, 3], [4, 7], [8, 15], …"""
    return max(rows, 1).bit_length()


def by_rows(stored: dict[str, float] | None) -> dict[int, dict[str, float]]:
    """The stored ``B:field`` sums as {B: {field: value}}."""
    nested: dict[int, dict[str, float]] = {}
    for key, value in (stored or {}).items():
        rows, _, name = key.partition(":")
        nested.setdefault(int(rows), {})[name] = float(value)
    return nested


def _round_seconds(paces: dict[int, _Pace]) -> Callable[[float], float]:
    """A plain round's seconds by its row count, a line a + c·B fitted (least squares, weighted by
    rounds) to the row counts with plain rounds; flat (a round's time the same at any B, as where
    decoding is bound by reading the weights) while they are of one row count."""
    points = [(float(b), p.seconds / p.rounds, p.rounds) for b, p in paces.items() if p.rounds and p.tokens]
    weight = sum(w for _, _, w in points)
    mean_b = sum(b * w for b, _, w in points) / weight
    mean_t = sum(t * w for _, t, w in points) / weight
    spread = sum(w * (b - mean_b) ** 2 for b, _, w in points)
    slope = max(sum(w * (b - mean_b) * (t - mean_t) for b, t, w in points) / spread, 0.0) if spread else 0.0
    intercept = mean_t - slope * mean_b
    floor = 0.1 * mean_t  # a line that would reach zero: no cheaper than a tenth of the mean round

    return lambda rows: max(intercept + slope * rows, floor)


def plain_rounds(job: Job) -> int:
    """The job's plain rounds, probes and rounds that chose k = 0 alike (what its speedup rests on)."""
    return round(sum(r.get("plain_rounds", 0.0) for r in by_rows(job.rounds_by_rows).values()))


def speedup_by_rows(job: Job) -> Measured:
    """(plain decode time estimate + the rest of the busy time) / busy time, the plain estimate built
    row count by row count (the module's docstring)."""
    rounds = by_rows(job.rounds_by_rows)
    if not rounds or not job.busy_seconds:
        return Measured(None, note="no rounds timed by row count" if job.decode_rounds else None)
    exact = {
        b: _Pace(
            r.get("plain_rounds", 0.0),
            r.get("plain_tokens", 0.0),
            r.get("plain_seconds", 0.0),
            r.get("plain_sq", 0.0),
        )
        for b, r in rounds.items()
    }
    n_plain = sum(pace.rounds for pace in exact.values())
    if n_plain < MIN_PLAIN_ROUNDS:
        return Measured(None, note=f"too few probe rounds ({n_plain:.0f} plain, {MIN_PLAIN_ROUNDS} needed)")
    binned: dict[int, _Pace] = {}
    for b, pace in exact.items():
        binned.setdefault(_bin(b), _Pace()).add(pace)
    round_seconds = _round_seconds(exact)
    overall = _Pace()
    for pace in exact.values():
        overall.add(pace)
    covered = uncovered = plain = 0.0
    estimates: dict[int, tuple[_Pace, float]] = {}  # id of the pace used: (it, the estimate it made)
    for b, r in rounds.items():
        pace = exact[b] if exact[b].rounds >= MIN_PACE_ROUNDS else binned[_bin(b)]
        if pace.rounds < MIN_PACE_ROUNDS:  # too few in its bin too: the line through every plain round
            pace, per_token = overall, round_seconds(b) / b
            uncovered += r.get("seconds", 0.0)
        else:
            per_token = pace.per_token
            covered += r.get("seconds", 0.0)
        if pace is not exact[b] and pace is not overall:  # the bin's pace moved along the line to B
            mean_rows = pace.tokens / pace.rounds
            per_token *= round_seconds(b) / round_seconds(mean_rows) * mean_rows / b
        estimate = r.get("tokens", 0.0) * per_token
        plain += estimate
        estimates[id(pace)] = (pace, estimates.get(id(pace), (pace, 0.0))[1] + estimate)
    if not covered or covered < MIN_COVERED * (covered + uncovered):
        return Measured(None, note="too few probe rounds at the job's batch sizes")

    def measured(plain_estimate: float) -> float:
        return (job.busy_seconds - job.decode_seconds + plain_estimate) / job.busy_seconds

    spreads = [pace.relative_variance for pace, _ in estimates.values()]
    known = [rv for rv in spreads if rv is not None]
    if not known:
        return Measured(measured(plain))
    # a pace from a single round: as uncertain as the most uncertain pace measured
    variance = sum(
        e**2 * (rv if rv is not None else max(known))
        for (_, e), rv in zip(estimates.values(), spreads, strict=True)
    )
    margin = Z95 * math.sqrt(variance)
    return Measured(measured(plain), measured(max(plain - margin, 0.0)), measured(plain + margin))


def measured_speedup(job: Job) -> float | None:
    """The job's measured speedup (``speedup_by_rows``), None where it has too few plain rounds."""
    return speedup_by_rows(job).speedup


def elapsed_seconds(job: Job, now: datetime | None = None) -> float | None:
    """Seconds from when a worker first took the job to when it ended (to ``now`` while it runs)."""
    if job.started_at is None:
        return None
    end = job.finished_at or now or utcnow()
    if (end.tzinfo is None) != (job.started_at.tzinfo is None):  # SQLite gives naive UTC datetimes
        end = end.replace(tzinfo=None) if job.started_at.tzinfo is None else end.replace(tzinfo=UTC)
    return max((end - job.started_at).total_seconds(), 0.0)


def job_stats(job: Job, now: datetime | None = None) -> JobStats:
    measured = speedup_by_rows(job)
    elapsed = elapsed_seconds(job, now)
    greedy = not (job.spec or {}).get("temperature")
    return JobStats(
        acceptance_rate=_ratio(job.draft_accepted, job.draft_proposed),
        alpha=_ratio(job.draft_accepted, job.draft_accepted + job.draft_rejections),
        mean_accepted_per_round=_ratio(job.draft_accepted, job.target_rounds),
        tokens_per_second=_ratio(job.new_tokens, job.generate_seconds),
        elapsed_seconds=elapsed,
        elapsed_tokens_per_second=_ratio(job.new_tokens, elapsed or 0.0),
        mean_batch_size=_ratio(job.decode_rows, job.decode_rounds),
        measured_speedup=measured.speedup,
        measured_speedup_low=measured.low,
        measured_speedup_high=measured.high,
        expected_speedup=job.expected_speedup,
        lossless_rate=_ratio(job.lossless_matches, job.lossless_checked) if greedy else None,
        proposers=tallies_from_json(job.proposer_counts) or None,
        measured_speedup_note=measured.note,
    )
