"""The two files an ended OpenAI batch gets: its output lines (successes) and error lines (the rest).

Written once, when the batch's job has ended and no request of it runs (``write_outputs``, idempotent),
under names made from the batch's id; ``genjob.batches`` shows the batch as finalizing (or cancelling)
until they are there.
Must not know: torch, transformers, Celery's workers, HTTP.
"""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError

from genjob.constants import TERMINAL_JOB_STATUSES
from genjob.db import session_scope
from genjob.formats.openai_output import batch_output_lines
from genjob.settings import Settings
from genjob.store import files as file_store
from genjob.store.activity import running_items
from genjob.store.openai_batches import batch_job
from genjob.tables import Batch, Job

OUTPUT_PURPOSE = "batch_output"


def output_name(batch: Batch) -> str:
    return f"{batch.id}_output.jsonl"


def error_name(batch: Batch) -> str:
    return f"{batch.id}_error.jsonl"


def needed_files(batch: Batch, job: Job) -> list[tuple[str, bool]]:
    """The files an ended job's batch has, (name, of its successes): output lines if any request
    succeeded, error lines if any did not."""
    needed = [(output_name(batch), True)] if job.done > 0 else []
    return needed + ([(error_name(batch), False)] if job.done < job.total else [])


def write_outputs(settings: Settings, *, batch_id: str) -> None:
    """Write a batch's output and error files once its job has ended and nothing runs (idempotent; a
    concurrent writer's files win)."""
    try:
        with session_scope(settings.database_url) as session:
            batch = session.get(Batch, batch_id)
            job = batch_job(session, batch=batch) if batch is not None else None
            if batch is None or job is None or job.status not in TERMINAL_JOB_STATUSES:
                return
            if running_items(session, job_ids=[job.id]):
                return
            present = file_store.job_files(session, job_id=job.id)
            for name, done in needed_files(batch, job):
                if name not in present:
                    file_store.put_file(
                        session,
                        owner=batch.owner,
                        purpose=OUTPUT_PURPOSE,
                        filename=name,
                        chunks=batch_output_lines(session, job, done=done),
                        job_id=job.id,
                    )
    except IntegrityError:
        return  # another request wrote them first
