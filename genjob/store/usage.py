"""Usage per owner (API key): requests, prompt and completion tokens of its jobs, over a period.

Read from the results themselves (each done item's tokens, by the owner of its job), so nothing on
the workers' hot path counts twice or is lost; a purged job's usage goes with it.
Must not know: Celery, torch, the HTTP API or the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from genjob.tables import Item, Job, Result


@dataclass(frozen=True)
class Usage:
    owner: str
    jobs: int  # submitted in the period
    requests: int  # items done or failed in the period
    failed_requests: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def usage_by_owner(session: Session, *, since: datetime, owner: str | None = None) -> list[Usage]:
    """Each owner's usage since ``since`` (only ``owner``'s when given), by owner id."""
    done = (
        select(
            Job.owner,
            func.count(Result.id),
            func.coalesce(func.sum(Result.prompt_tokens), 0),
            func.coalesce(func.sum(Result.new_tokens), 0),
        )
        .join(Job, Job.id == Result.job_id)
        .where(Result.created_at >= since)
        .group_by(Job.owner)
    )
    failed = (
        select(Job.owner, func.count(Item.id))
        .join(Job, Job.id == Item.job_id)
        .where(Item.status == "failed", Item.finished_at >= since)
        .group_by(Job.owner)
    )
    submitted = select(Job.owner, func.count(Job.id)).where(Job.created_at >= since).group_by(Job.owner)
    if owner is not None:
        done = done.where(Job.owner == owner)
        failed = failed.where(Job.owner == owner)
        submitted = submitted.where(Job.owner == owner)
    tokens = {row[0]: (int(row[1]), int(row[2]), int(row[3])) for row in session.execute(done)}
    failures = {row[0]: int(row[1]) for row in session.execute(failed)}
    jobs = {row[0]: int(row[1]) for row in session.execute(submitted)}
    owners = sorted(set(tokens) | set(failures) | set(jobs) | ({owner} if owner else set()))
    return [
        Usage(
            owner=name,
            jobs=jobs.get(name, 0),
            requests=tokens.get(name, (0, 0, 0))[0] + failures.get(name, 0),
            failed_requests=failures.get(name, 0),
            prompt_tokens=tokens.get(name, (0, 0, 0))[1],
            completion_tokens=tokens.get(name, (0, 0, 0))[2],
        )
        for name in owners
    ]
