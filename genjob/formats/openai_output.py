"""OpenAI batch output lines: one response (or error) per item, in input order.

``{"id", "custom_id", "response": {"status_code": 200, "request_id", "body": {...}}, "error": null}``
with a ``text_completion`` or ``chat.completion`` body, or ``response: null`` and an ``error`` for an
item that failed, was cancelled or has not run yet; a batch's output and error files are these lines
(``batch_output_lines``). Must not know: Celery, torch, HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sqlalchemy.orm import Session

from genjob.constants import ItemStatus, OpenAIEndpoint
from genjob.formats.result_fields import openai_fields
from genjob.store import iter_results
from genjob.tables import Item, Job, Result


def _usage(result: Result) -> dict[str, Any]:
    """OpenAI's usage, with the draft's tokens as predictions: ``accepted_prediction_tokens`` are the
    drafted tokens the target kept, ``rejected_prediction_tokens`` those it refused."""
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.new_tokens,
        "total_tokens": result.prompt_tokens + result.new_tokens,
        "completion_tokens_details": {
            "accepted_prediction_tokens": result.draft_accepted,
            "rejected_prediction_tokens": max(0, result.draft_proposed - result.draft_accepted),
        },
    }


def model_label(location: str) -> str:
    """A model as a client may see it: a hub id as is, a local path by its last part only."""
    return location.rstrip("/").rsplit("/", 1)[-1] if location.startswith(("/", ".", "~")) else location


def job_model(job: Job, *, paths: bool = False) -> str:
    """The job's target as an output names it: by the allow-list name it was submitted with, else a hub
    id as is and a local path whole with ``paths`` (the CLI: whoever runs the workers gave that path,
    and two models called ``target`` must not look alike), by its last part without (the API: never a
    server path)."""
    return job.model_name or (job.model if paths else model_label(job.model))


def response_body(job: Job, item: Item, result: Result, *, model_paths: bool = False) -> dict[str, Any]:
    endpoint = job.spec.get("endpoint") or OpenAIEndpoint.COMPLETIONS
    created = int(result.created_at.timestamp()) if result.created_at else None
    if endpoint == OpenAIEndpoint.CHAT_COMPLETIONS:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": result.output},
            "finish_reason": result.finish_reason,
            "logprobs": None,
        }
        kind, prefix = "chat.completion", "chatcmpl"
    else:
        choice = {"index": 0, "text": result.output, "finish_reason": result.finish_reason, "logprobs": None}
        kind, prefix = "text_completion", "cmpl"
    return {
        "id": f"{prefix}-{job.id}-{item.seq}",
        "object": kind,
        "created": created,
        "model": job_model(job, paths=model_paths),
        "choices": [choice],
        "usage": _usage(result),
        "genjob": openai_fields(result),  # genjob's extension (the SDK ignores it)
    }


def response_record(
    job: Job, item: Item, result: Result | None, *, model_paths: bool = False
) -> dict[str, Any]:
    """One OpenAI batch output line for an item (a response, or an error saying why there is none);
    ``model_paths``: see ``job_model``."""
    record: dict[str, Any] = {"id": f"batch_req_{job.id}_{item.seq}", "custom_id": item.custom_id}
    if result is not None and item.status == ItemStatus.DONE:
        record["response"] = {
            "status_code": 200,
            "request_id": f"{job.id}-{item.seq}",
            "body": response_body(job, item, result, model_paths=model_paths),
        }
        record["error"] = None
        return record
    record["response"] = None
    record["error"] = {"code": f"item_{item.status}", "message": item.error or f"item is {item.status}"}
    return record


# The codes OpenAI's batch error files use for requests a batch did not run.
BATCH_ERROR_CODES = {ItemStatus.CANCELLED: "batch_cancelled", ItemStatus.EXPIRED: "batch_expired"}


def batch_output_lines(session: Session, job: Job, *, done: bool) -> Iterator[bytes]:
    """A batch's output file (``done``: the items done) or error file (every other item), as JSONL bytes."""
    for item, result in iter_results(session, job_id=job.id, status=ItemStatus.DONE if done else None):
        if not done and item.status == ItemStatus.DONE:
            continue
        record = response_record(job, item, result)
        if record["error"] is not None:
            record["error"]["code"] = BATCH_ERROR_CODES.get(ItemStatus(item.status), record["error"]["code"])
        yield (json.dumps(record, ensure_ascii=False) + "\n").encode()
