"""The OpenAI batch line format, on input (request lines) and on output (response lines).

Input, one request per line, as in an OpenAI batch file::

    {"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "…", "max_tokens": 64}}
    {"custom_id": "r2", "body": {"messages": [{"role": "user", "content": "..."}]}}

``method`` and ``url`` are optional (the body tells which endpoint it is), but one file uses one
endpoint. ``body.model`` is accepted and ignored: the job's model decides. Chat ``messages`` are
rendered to prompt text at submit time with the target tokenizer's chat template, so the stored
items, the worker and the engine (ids only) are the same for every format, and a template error is
reported with its line before anything is stored.

Output, one response per item in input order::

    {"id": "...", "custom_id": "r1", "response": {"status_code": 200, "request_id": "...", "body": {...}},
     "error": null}

with a ``text_completion`` or ``chat.completion`` body, or ``response: null`` and an ``error`` for an
item that failed, was cancelled or has not run yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator, model_validator

from genjob.constants import ItemStatus, OpenAIEndpoint
from genjob.models import Item, Job, Result

# Fields each object of a request line allows, by path (list indices as "*"), for error messages.
ALLOWED_FIELDS = {
    "": ("custom_id", "method", "url", "body"),
    "body": ("model", "prompt", "messages", "max_tokens", "max_completion_tokens"),
    "body.messages.*": ("role", "content", "name"),
}

ChatRenderer = Callable[[list[dict[str, str]]], str]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr
    name: StrictStr | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        """OpenAI also allows ``[{"type": "text", "text": "..."}, ...]``: joined into one string."""
        if isinstance(value, list):
            if not all(
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
                and part.keys() == {"type", "text"}
                for part in value
            ):
                raise ValueError('must be a string or a list of {"type": "text", "text": "..."} parts')
            return "".join(part["text"] for part in value)
        return value


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None  # accepted and ignored: the job's model decides
    prompt: StrictStr | None = Field(default=None, min_length=1)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None

    @field_validator("prompt")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank")
        return value

    @model_validator(mode="after")
    def _one_input(self) -> Self:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError(
                "give exactly one of 'prompt' (/v1/completions) or 'messages' (/v1/chat/completions)"
            )
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give at most one of 'max_tokens' or 'max_completion_tokens'")
        return self

    @property
    def endpoint(self) -> OpenAIEndpoint:
        return OpenAIEndpoint.COMPLETIONS if self.prompt is not None else OpenAIEndpoint.CHAT_COMPLETIONS


class RequestLine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    custom_id: StrictStr | None = Field(default=None, min_length=1, max_length=200)
    method: Literal["POST"] | None = None
    url: OpenAIEndpoint | None = None
    body: RequestBody

    @model_validator(mode="after")
    def _url_matches_body(self) -> Self:
        if self.url is not None and self.url is not self.body.endpoint:
            wanted = "'prompt'" if self.url is OpenAIEndpoint.COMPLETIONS else "'messages'"
            raise ValueError(f"url {self.url.value} takes a body with {wanted}")
        return self

    @property
    def max_new_tokens(self) -> int | None:
        return self.body.max_tokens if self.body.max_tokens is not None else self.body.max_completion_tokens

    @property
    def max_new_tokens_field(self) -> str:
        return (
            "body.max_completion_tokens" if self.body.max_completion_tokens is not None else "body.max_tokens"
        )


def allowed_fields(loc: Sequence[str | int]) -> str:
    """The fields allowed beside an unknown one at ``loc`` (for the error message)."""
    parent = ".".join("*" if isinstance(part, int) else str(part) for part in loc[:-1])
    return ", ".join(ALLOWED_FIELDS.get(parent, ()))


class ChatTemplateError(ValueError):
    """Messages could not be rendered to a prompt (no template, no tokenizer, or the template refused)."""


class ChatTemplate:
    """Renders chat messages with the chat template of ``model``'s tokenizer, loaded on first use.

    A template usually starts with the BOS token; when the tokenizer also adds BOS itself on
    encoding (as the worker does), the rendered text drops its own so the worker's ids carry
    exactly one, the same ids as ``apply_chat_template(tokenize=True)``.
    """

    def __init__(self, model: str) -> None:
        self.model = model
        self._tokenizer = None
        self._error: str | None = None

    def _load(self):
        if self._tokenizer is None and self._error is None:
            from worker.loading import ModelLoadError, load_tokenizer

            try:
                self._tokenizer = load_tokenizer(self.model)
            except ModelLoadError as exc:
                self._error = f"messages need the target's tokenizer: {exc}"
            else:
                if not self._tokenizer.chat_template:
                    self._error = (
                        f"the tokenizer of {self.model!r} has no chat template: "
                        "send 'prompt' lines (/v1/completions) instead"
                    )
        if self._error is not None:
            raise ChatTemplateError(self._error)
        return self._tokenizer

    def __call__(self, messages: list[dict[str, str]]) -> str:
        tokenizer = self._load()
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja2 errors, raise_exception() in templates, bad roles…
            raise ChatTemplateError(f"the chat template refused the messages: {exc}") from exc
        bos = tokenizer.bos_token
        if bos and text.startswith(bos):
            added = tokenizer("")["input_ids"]
            if added and added[0] == tokenizer.bos_token_id:
                text = text[len(bos) :]
        return text


def request_prompt(line: RequestLine, chat: ChatRenderer | None) -> str:
    """The prompt text of a request line: its ``prompt``, or its ``messages`` through ``chat``."""
    if line.body.prompt is not None:
        return line.body.prompt
    assert line.body.messages is not None
    if chat is None:
        raise ChatTemplateError("messages need a chat template, and none is available here")
    return chat([message.model_dump(exclude_none=True) for message in line.body.messages])


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
