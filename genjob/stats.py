"""Stats maths of a job: acceptance rate, α, expected (Leviathan et al.) and measured speedup.

Pure functions of the job's stored sums. Must not know: the database session, torch, Celery.
"""

from __future__ import annotations

from dataclasses import dataclass

from genjob.tables import Job


@dataclass(frozen=True)
class JobStats:
    acceptance_rate: float | None
    mean_accepted_per_round: float | None
    tokens_per_second: float | None
    measured_speedup: float | None
    expected_speedup: float | None
    lossless_rate: float | None


def expected_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Leviathan et al. 2023, eq. 1: (1 − α^(γ+1)) / ((1 − α)(γc + 1)); the limit γ+1 at α = 1."""
    if alpha >= 1.0:
        return (gamma + 1) / (gamma * cost_ratio + 1)
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * cost_ratio + 1))


def iid_acceptance(tokens_per_round: float, gamma: int) -> float:
    """The per-token acceptance probability α of Leviathan et al.'s i.i.d. model that yields the
    observed mean tokens per round: solve (1 − α^(γ+1)) / (1 − α) = tokens_per_round by bisection."""
    if tokens_per_round >= gamma + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if sum(mid**k for k in range(gamma + 1)) < tokens_per_round:
            low = mid
        else:
            high = mid
    return low


def job_stats(job: Job) -> JobStats:
    """Aggregates of a job. The acceptance rate shown is accepted / proposed. The expected speedup
    applies Leviathan et al.'s formula with γ = the mean tokens proposed per round (the heuristic
    schedule varies it), the measured c, and the i.i.d. α that explains the observed tokens per round
    (accepted / proposed understates it when γ runs long)."""
    alpha = job.draft_accepted / job.draft_proposed if job.draft_proposed else None
    expected = None
    if alpha is not None and job.target_rounds and job.cost_ratio is not None:
        gamma = max(1, round(job.draft_proposed / job.target_rounds))
        tokens_per_round = (job.target_rounds + job.draft_accepted) / job.target_rounds
        expected = expected_speedup(iid_acceptance(tokens_per_round, gamma), gamma, job.cost_ratio)
    greedy = not (job.spec or {}).get("temperature")
    return JobStats(
        acceptance_rate=alpha,
        mean_accepted_per_round=job.draft_accepted / job.target_rounds if job.target_rounds else None,
        tokens_per_second=job.new_tokens / job.generate_seconds if job.generate_seconds else None,
        measured_speedup=(
            job.baseline_seconds / job.baseline_assisted_seconds if job.baseline_assisted_seconds else None
        ),
        expected_speedup=expected,
        lossless_rate=job.baseline_matches / job.baseline_items if job.baseline_items and greedy else None,
    )
