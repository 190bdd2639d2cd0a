"""Export a job's results in input order as JSONL, CSV or OpenAI batch output, streamed.

Shared by the CLI (``genjob results``) and the API (``GET /v1/jobs/{id}/results``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

from sqlalchemy.orm import Session

from genjob import store
from genjob.formats.openai_output import response_record
from genjob.tables import Item, Job, Result


class ResultFormat(StrEnum):
    JSONL = "jsonl"
    CSV = "csv"
    OPENAI = "openai"  # OpenAI batch output lines: {"custom_id", "response": {"body"}, "error"}


RESULT_FIELDS = (
    "id",
    "index",
    "line",
    "status",
    "output",
    "finish_reason",
    "prompt_tokens",
    "new_tokens",
    "target_rounds",
    "draft_proposed",
    "draft_accepted",
    "latency_s",
    "error",
)


def result_record(item: Item, result: Result | None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": item.custom_id,
        "index": item.seq,
        "line": item.line,
        "status": item.status,
        "output": None,
        "finish_reason": None,
        "prompt_tokens": None,
        "new_tokens": None,
        "target_rounds": None,
        "draft_proposed": None,
        "draft_accepted": None,
        "latency_s": None,
        "error": item.error,
    }
    if result is not None:
        record.update(
            output=result.output,
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
            new_tokens=result.new_tokens,
            target_rounds=result.target_rounds,
            draft_proposed=result.draft_proposed,
            draft_accepted=result.draft_accepted,
            latency_s=round(result.latency_s, 6),
        )
    return record


def iter_result_records(session: Session, *, job_id: str) -> Iterator[dict[str, Any]]:
    for item, result in store.iter_results(session, job_id=job_id):
        yield result_record(item, result)


def render(records: Iterator[dict[str, Any]], fmt: ResultFormat) -> Iterator[str]:
    """Text chunks of the export, one per record (plus the CSV header)."""
    if fmt is ResultFormat.OPENAI:
        raise ValueError("the openai format needs the job: use export_job")
    if fmt is ResultFormat.JSONL:
        for record in records:
            yield json.dumps(record, ensure_ascii=False) + "\n"
        return
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=RESULT_FIELDS, lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow(record)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue()


def export_job(session: Session, *, job: Job, fmt: ResultFormat) -> Iterator[str]:
    """Text chunks of a job's export in ``fmt``, one per item in input order."""
    if fmt is not ResultFormat.OPENAI:
        yield from render(iter_result_records(session, job_id=job.id), fmt)
        return
    for item, result in store.iter_results(session, job_id=job.id):
        yield json.dumps(response_record(job, item, result), ensure_ascii=False) + "\n"
