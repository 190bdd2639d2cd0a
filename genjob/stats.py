"""Stats maths of a job, from the sums stored on its row; every figure one a user can check.

- acceptance rate = draft tokens accepted / proposed;
- α, the per-token acceptance of Leviathan et al.'s formula = accepted / (accepted + rejections):
  each round is a run of accepted drafts ended by one rejection (or by running out of drafts), so
  this is the rate that explains the observed runs;
- measured speedup = the job's tokens/s ÷ plain tokens/s at the same batch size on the same workers:
  every ``1/F``-th round a worker decodes its whole batch plainly (a probe round); their seconds per
  token, times every decoded token, estimate the decode time of a plain job; the rest of the
  workers' time (prefill, bookkeeping) is the same either way. With a 95 % interval from the spread
  of the probe rounds;
- tokens/s two ways: wall-clock (``elapsed_tokens_per_second``) = new tokens / (started → finished,
  or → now while it runs), what the job delivered, as the ``job_stats`` view has it; decoding
  (``tokens_per_second``) = new tokens / the items' generate seconds (each item's share of its
  batch's time), the models' pace with queueing, model loading and gaps left out;
- per proposer (mode auto): the rounds each proposer drafted for a row, the tokens it proposed, those
  accepted and its rejections, so its own acceptance is accepted / proposed;
- expected speedup: computed by the worker from α, the rounds at each draft length k and the costs it
  measured at the job's mean batch size (``genjob.generation.costs.expected_speedup``), stored.
Must not know: the database session, torch, Celery.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

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
    proposers: dict[str, dict[str, int]] | None = None  # mode auto: per proposer, its counts


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def measured_speedup(job: Job, plain_per_token: float | None = None) -> float | None:
    """(plain decode time estimate + the rest of the busy time) / busy time; None without probes."""
    if plain_per_token is None:
        plain_per_token = _ratio(job.probe_seconds, job.probe_tokens)
    if plain_per_token is None or not job.busy_seconds or not job.decode_seconds:
        return None
    plain = job.busy_seconds - job.decode_seconds + job.decode_tokens * plain_per_token
    return plain / job.busy_seconds


def _interval(job: Job) -> tuple[float | None, float | None]:
    """95 % interval of the measured speedup from the spread of the probe rounds' seconds per token."""
    n = job.probe_rounds
    mean = _ratio(job.probe_seconds, job.probe_tokens)
    if n < 2 or mean is None:
        return None, None
    per_round_mean = job.probe_sq / n
    spread = math.sqrt(max(per_round_mean - mean**2, 0.0) * n / (n - 1))
    margin = Z95 * spread / math.sqrt(n)
    return measured_speedup(job, max(mean - margin, 0.0)), measured_speedup(job, mean + margin)


def elapsed_seconds(job: Job, now: datetime | None = None) -> float | None:
    """Seconds from when a worker first took the job to when it ended (to ``now`` while it runs)."""
    if job.started_at is None:
        return None
    end = job.finished_at or now or utcnow()
    if (end.tzinfo is None) != (job.started_at.tzinfo is None):  # SQLite gives naive UTC datetimes
        end = end.replace(tzinfo=None) if job.started_at.tzinfo is None else end.replace(tzinfo=UTC)
    return max((end - job.started_at).total_seconds(), 0.0)


def job_stats(job: Job, now: datetime | None = None) -> JobStats:
    low, high = _interval(job)
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
        measured_speedup=measured_speedup(job),
        measured_speedup_low=low,
        measured_speedup_high=high,
        expected_speedup=job.expected_speedup,
        lossless_rate=_ratio(job.lossless_matches, job.lossless_checked) if greedy else None,
        proposers=by_proposer(job.proposer_counts),
    )


def by_proposer(counts: dict[str, int] | None) -> dict[str, dict[str, int]] | None:
    """Stored per-proposer counts (flat ``name:field`` keys) as {name: {field: n}}; None if none."""
    if not counts:
        return None
    nested: dict[str, dict[str, int]] = {}
    for key, value in sorted(counts.items()):
        name, _, field_name = key.rpartition(":")
        nested.setdefault(name, {})[field_name] = int(value)
    return nested
