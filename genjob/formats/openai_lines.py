"""The OpenAI batch line format, on input (request lines) and on output (response lines).

Input, one request per line, as in an OpenAI batch file::

    {"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "…", "max_tokens": 64}}
    {"custom_id": "r2", "body": {"messages": [{"role": "user", "content": "..."}]}}

``method`` and ``url`` are optional (the body tells which endpoint it is), but one file uses one
endpoint. ``body.model`` is checked by the Batches API (every line names the batch's model) and
ignored by ``--input-format openai`` jobs (the job's model decides). The standard sampling fields
take OpenAI's meaning (``temperature``, ``top_p``, ``seed``, ``stop``; a field left out takes the
job's value), ``n`` may only be 1 and ``stream`` only false, ``user`` and ``metadata`` are accepted
and not used; any other field is refused with its line and name. Chat ``messages`` are
rendered to prompt text at submit time with the target tokenizer's chat template, so the stored
items, the worker and the engine (ids only) are the same for every format, and a template error is
reported with its line before anything is stored.

Output lines are ``genjob.formats.openai_output``; they look like this, one response per item in input order::

    {"id": "...", "custom_id": "r1", "response": {"status_code": 200, "request_id": "...", "body": {...}},
     "error": null}

with a ``text_completion`` or ``chat.completion`` body, or ``response: null`` and an ``error`` for an
item that failed, was cancelled or has not run yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from genjob.constants import OpenAIEndpoint
from genjob.formats.lines import LineProblem, LineSampling, ParsedLine, describe_validation_error
from genjob.formats.tokenizing import SubmitTokenizer

MAX_STOP_STRINGS = 4  # as OpenAI
MAX_STOP_CHARS = 200

# Fields each object of a request line allows, by path (list indices as "*"), for error messages.
ALLOWED_FIELDS = {
    "": ("custom_id", "method", "url", "body"),
    "body": (
        "model",
        "prompt",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "n",
        "stream",
        "user",
        "metadata",
    ),
    "body.messages.*": ("role", "content", "name"),
}


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


NotBlank = Annotated[StrictStr, AfterValidator(_not_blank)]  # a string with more than white space


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
    prompt: NotBlank | None = Field(default=None, min_length=1)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: StrictFloat | None = Field(default=None, ge=0.0, le=2.0)
    top_p: StrictFloat | None = Field(default=None, gt=0.0, le=1.0)
    seed: StrictInt | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: StrictStr | list[StrictStr] | None = None
    n: Literal[1] | None = None
    stream: Literal[False] | None = None
    user: StrictStr | None = Field(default=None, max_length=256)
    metadata: dict[StrictStr, StrictStr] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        if any(not stop or len(stop) > MAX_STOP_CHARS for stop in stops):
            raise ValueError(f"each stop string must have 1 to {MAX_STOP_CHARS} characters")
        return value

    @property
    def sampling(self) -> LineSampling | None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop) if self.stop else None
        if self.temperature is None and self.top_p is None and self.seed is None and stop is None:
            return None
        return LineSampling(self.temperature, self.top_p, self.seed, stop)

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

    custom_id: NotBlank | None = Field(default=None, min_length=1, max_length=200)
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


def request_prompt(line: RequestLine, tokenizer: SubmitTokenizer | None) -> str:
    """The prompt text of a request line: its ``prompt``, or its ``messages`` through the chat template."""
    if line.body.prompt is not None:
        return line.body.prompt
    assert line.body.messages is not None
    if tokenizer is None:
        raise LineProblem("messages need a chat template, and none is available here", "body.messages")
    messages = [message.model_dump(exclude_none=True) for message in line.body.messages]
    try:
        return tokenizer.render_chat(messages)
    except ValueError as exc:
        raise LineProblem(str(exc), "body.messages") from exc


def parse_openai_line(data: dict[str, Any], tokenizer: SubmitTokenizer | None) -> ParsedLine:
    try:
        parsed = RequestLine.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise describe_validation_error(exc, allowed_fields(first["loc"])) from exc
    prompt = request_prompt(parsed, tokenizer)
    prompt_field = "body.prompt" if parsed.body.prompt is not None else "body.messages"
    return ParsedLine(
        prompt,
        parsed.custom_id,
        parsed.max_new_tokens,
        endpoint=parsed.body.endpoint,
        id_field="custom_id",
        prompt_field=prompt_field,
        max_new_tokens_field=parsed.max_new_tokens_field,
        sampling=parsed.body.sampling,
        model=parsed.body.model,
    )
