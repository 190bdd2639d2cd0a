"""Response bodies of the API (pydantic, so they document the OpenAPI spec).

The job options of ``POST /v1/jobs`` are ``genjob.options.JobOptions`` itself, as query parameters.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from genjob.constants import JobStatus
from genjob.formats.openai_output import model_label
from genjob.stats import job_stats
from genjob.tables import Job


class JobStatsOut(BaseModel):
    new_tokens: int
    target_rounds: int
    draft_proposed: int
    draft_accepted: int
    draft_rejections: int
    generate_seconds: float
    acceptance_rate: float | None = Field(description="Draft tokens accepted / proposed.")
    alpha: float | None = Field(description="Per-token α: accepted / (accepted + rejections).")
    mean_accepted_per_round: float | None
    tokens_per_second: float | None
    mean_batch_size: float | None
    gamma_hist: dict[str, int] | None = Field(description="Rounds by draft length k.")
    drafts_hist: dict[str, int] | None = Field(
        description="Row-rounds by the drafts the row had (m ≤ k; prompt lookup often has fewer)."
    )
    last_draft_tokens: int | None = Field(description="γ: the draft length last used.")
    cost_ratio: float | None = Field(description="c: draft step / target step at the mean batch size.")
    costs: dict[str, Any] | None = Field(description="Forward costs measured on a worker (ms).")
    expected_speedup: float | None
    proposers: dict[str, dict[str, int]] | None = Field(
        default=None,
        description="Mode auto, per proposer: rounds it drafted for a row, tokens proposed, accepted, "
        "rejections.",
    )
    measured_speedup: float | None = Field(
        description="Tokens/s ÷ plain tokens/s at the same batch size on the same workers (probe rounds)."
    )
    measured_speedup_low: float | None
    measured_speedup_high: float | None
    probe_rounds: int
    lossless_checked: int
    lossless_rate: float | None


class JobOut(BaseModel):
    id: str
    owner: str = Field(description="The API key's owner id that submitted it (local: the CLI).")
    name: str | None
    status: JobStatus
    model: str
    assistant: str | None
    mode: str
    queue: str
    spec: dict[str, Any] = Field(description="The generation options (JobSpec) the workers use.")
    total: int
    done: int
    failed: int
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    expires_at: datetime | None
    stats: JobStatsOut

    @classmethod
    def of(cls, job: Job) -> JobOut:
        """The job as clients see it: models by the names they were given (never a server path)."""
        stats = {name: getattr(job, name) for name in JobStatsOut.model_fields if hasattr(job, name)}
        derived = asdict(job_stats(job))
        stats.update({name: value for name, value in derived.items() if name in JobStatsOut.model_fields})
        if stats["proposers"]:  # a tally's fields by name, in the order the API has always answered them
            stats["proposers"] = {
                name: dict(sorted(tally.items())) for name, tally in stats["proposers"].items()
            }
        model = job.model_name or model_label(job.model)
        assistant = job.assistant_name or (model_label(job.assistant) if job.assistant else None)
        spec = {**job.spec, "model": model, "assistant": assistant}
        return cls(
            id=job.id,
            owner=job.owner,
            name=job.name,
            status=JobStatus(job.status),
            model=model,
            assistant=assistant,
            mode=job.mode,
            queue=job.queue,
            spec=spec,
            total=job.total,
            done=job.done,
            failed=job.failed,
            error=_without_paths(job.error, job, model, assistant),
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            expires_at=job.expires_at,
            stats=JobStatsOut(**stats),
        )


def _without_paths(text: str | None, job: Job, model: str, assistant: str | None) -> str | None:
    """An error text with the job's model paths replaced by their names."""
    if text is None:
        return None
    if job.assistant and assistant:
        text = text.replace(job.assistant, assistant)
    return text.replace(job.model, model)


class JobList(BaseModel):
    data: list[JobOut] = Field(description="Newest first.")
    limit: int
    offset: int
    next_offset: int | None = Field(description="Offset of the next page; null on the last page.")


class RequeueOut(BaseModel):
    job: JobOut
    chunks: int = Field(description="Task messages pushed for the job's pending items.")


class HealthOut(BaseModel):
    status: str = Field(description="ok, or unavailable when a dependency fails (HTTP 503).")
    database: str
    broker: str
