"""OpenAI batch output lines: one response (or error) per item, in input order.

``{"id", "custom_id", "response": {"status_code": 200, "request_id", "body": {...}}, "error": null}``
with a ``text_completion`` or ``chat.completion`` body, or ``response: null`` and an ``error`` for an
item that failed, was cancelled or has not run yet. Must not know: Celery, torch, HTTP.
"""

from __future__ import annotations

from typing import Any

from genjob.constants import ItemStatus, OpenAIEndpoint
from genjob.tables import Item, Job, Result


def _usage(result: Result) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.new_tokens,
        "total_tokens": result.prompt_tokens + result.new_tokens,
    }


def response_body(job: Job, item: Item, result: Result) -> dict[str, Any]:
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
        "model": job.model,
        "choices": [choice],
        "usage": _usage(result),
    }


def response_record(job: Job, item: Item, result: Result | None) -> dict[str, Any]:
    """One OpenAI batch output line for an item (a response, or an error saying why there is none)."""
    record: dict[str, Any] = {"id": f"batch_req_{job.id}_{item.seq}", "custom_id": item.custom_id}
    if result is not None and item.status == ItemStatus.DONE:
        record["response"] = {
            "status_code": 200,
            "request_id": f"{job.id}-{item.seq}",
            "body": response_body(job, item, result),
        }
        record["error"] = None
        return record
    record["response"] = None
    record["error"] = {"code": f"item_{item.status}", "message": item.error or f"item is {item.status}"}
    return record
