"""Export a job's results in input order as JSONL, CSV or OpenAI batch output, streamed.

Shared by the CLI (``genjob results``) and the API (``GET /v1/jobs/{id}/results``). Exports keep the
exact text by default; ``csv_safe`` prefixes a ``'`` to CSV cells that a spreadsheet would run as a
formula (starting with ``=``, ``+``, ``-``, ``@``, tab or carriage return). ``status`` keeps only the
items in that state (``failed``, say). A record's fields are declared in ``genjob.formats.result_fields``;
Parquet is ``genjob.formats.parquet``.
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
from genjob.formats.result_fields import EXPORT_NAMES, result_record
from genjob.tables import Job


class ResultFormat(StrEnum):
    JSONL = "jsonl"
    CSV = "csv"
    OPENAI = "openai"  # OpenAI batch output lines: {"custom_id", "response": {"body"}, "error"}
    PARQUET = "parquet"  # binary: genjob.formats.parquet


FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def iter_result_records(
    session: Session, *, job_id: str, status: str | None = None
) -> Iterator[dict[str, Any]]:
    for item, result in store.iter_results(session, job_id=job_id, status=status):
        yield result_record(item, result)


def csv_safe_cell(value: Any) -> Any:
    """A text cell a spreadsheet would evaluate (``=cmd|...``) made inert with a leading ``'``."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def render(records: Iterator[dict[str, Any]], fmt: ResultFormat, *, csv_safe: bool = False) -> Iterator[str]:
    """Text chunks of the export, one per record (the CSV header its own first chunk)."""
    if fmt in (ResultFormat.OPENAI, ResultFormat.PARQUET):
        raise ValueError(f"the {fmt} format is not text rows: use export_job or genjob.formats.parquet")
    if fmt is ResultFormat.JSONL:
        for record in records:
            yield json.dumps(record, ensure_ascii=False) + "\n"
        return
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=EXPORT_NAMES, lineterminator="\n")
    writer.writeheader()
    yield buffer.getvalue()
    for record in records:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow({k: csv_safe_cell(v) for k, v in record.items()} if csv_safe else record)
        yield buffer.getvalue()


def export_job(
    session: Session,
    *,
    job: Job,
    fmt: ResultFormat,
    status: str | None = None,
    csv_safe: bool = False,
    model_paths: bool = False,
) -> Iterator[str]:
    """Text chunks of a job's export in ``fmt``, one per item in input order; ``model_paths``: OpenAI
    lines name a model given as a path by the whole path (the CLI), not its last part (the API)."""
    if fmt is not ResultFormat.OPENAI:
        yield from render(iter_result_records(session, job_id=job.id, status=status), fmt, csv_safe=csv_safe)
        return
    for item, result in store.iter_results(session, job_id=job.id, status=status):
        record = response_record(job, item, result, model_paths=model_paths)
        yield json.dumps(record, ensure_ascii=False) + "\n"
