"""Streaming validation of prompt files (JSONL), shared by the CLI and the HTTP API.

A file is read line by line in binary, never whole: the file and each line are bounded in size,
each line is decoded as strict UTF-8, parsed as a JSON object and validated field by field.
Errors name the file, the line and the field. ``validate_prompt_file`` checks a whole file
before anything is stored; ``iter_prompt_file`` yields the valid items for the insert that
follows. ``model_context_check`` adds a check of each prompt's length against the model's
context when the model is a local directory.

Two line formats (``InputFormat``): genjob's own ``{"prompt", "id", "max_new_tokens"}`` and the
OpenAI batch request format (``genjob.openai_batch``), whose chat messages are rendered to prompt
text by a ``ChatRenderer`` (the target tokenizer's chat template). Both give the same items.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator

from genjob.constants import InputFormat, OpenAIEndpoint
from genjob.openai_batch import ChatRenderer, ChatTemplateError, RequestLine, allowed_fields, request_prompt

UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
MAX_REPORTED_ERRORS = 20
GENJOB_FIELDS = "prompt, id, max_new_tokens"


class PromptLine(BaseModel):
    """One input line: ``{"prompt": "...", "id": "optional", "max_new_tokens": optional}``.

    Unknown fields are rejected (a misspelt ``max_new_token`` must not be ignored silently).
    """

    model_config = ConfigDict(extra="forbid")

    prompt: StrictStr = Field(min_length=1)
    id: StrictStr | None = Field(default=None, min_length=1, max_length=200)
    max_new_tokens: StrictInt | None = None

    @field_validator("prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value


@dataclass(frozen=True, slots=True)
class PromptItem:
    seq: int  # position among the file's prompts, from 0
    line: int  # 1-based line number in the file
    prompt: str
    custom_id: str | None
    max_new_tokens: int | None
    endpoint: OpenAIEndpoint | None = None  # OpenAI request lines only


@dataclass(frozen=True, slots=True)
class LineError:
    line: int | None
    message: str
    field: str | None = None

    def format(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line is not None else source
        return f"{where}: {self.message}"


class InputFileError(ValueError):
    """A prompt file failed validation; ``errors`` holds the first few problems, each with its line."""

    def __init__(self, source: str, errors: list[LineError], *, more: int = 0) -> None:
        self.source = source
        self.errors = errors
        self.more = more
        lines = [error.format(source) for error in errors]
        if more:
            lines.append(f"… and {more} more errors")
        super().__init__("\n".join(lines))


class LineProblem(ValueError):
    """Why one line is invalid (and which field), raised while parsing it."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """A line's content, whatever its format, before the checks shared by every format."""

    prompt: str
    custom_id: str | None
    max_new_tokens: int | None
    endpoint: OpenAIEndpoint | None = None
    id_field: str = "id"
    prompt_field: str = "prompt"
    max_new_tokens_field: str = "max_new_tokens"


@dataclass(frozen=True)
class InputLimits:
    max_line_bytes: int = 1 << 20
    max_new_tokens_limit: int = 8192
    max_file_bytes: int = 512 << 20


# A per-prompt check beyond the line's own fields: an error message, or None if the prompt is fine.
PromptCheck = Callable[["PromptItem"], str | None]


class _FileTooLarge(Exception):
    pass


def file_too_large_message(size: int | None, limit: int) -> str:
    what = f"the file is {size} bytes" if size is not None else "the file is larger than that"
    return f"{what}, over the limit of {limit} bytes (GENJOB_MAX_UPLOAD_BYTES)"


def _json_type(value: object) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _describe_validation_error(exc: ValidationError, fmt: InputFormat) -> LineProblem:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    kind = first["type"]
    if kind == "missing":
        return LineProblem(f"missing required field '{field}'", field)
    if kind == "extra_forbidden":
        allowed = GENJOB_FIELDS if fmt is InputFormat.GENJOB else allowed_fields(first["loc"])
        return LineProblem(f"unknown field '{field}' (allowed: {allowed})", field)
    message = first["msg"].removeprefix("Value error, ")
    return LineProblem(f"field '{field}': {message}" if field else message, field)


def _parse_genjob_line(data: dict) -> ParsedLine:
    try:
        parsed = PromptLine.model_validate(data)
    except ValidationError as exc:
        raise _describe_validation_error(exc, InputFormat.GENJOB) from exc
    return ParsedLine(parsed.prompt, parsed.id, parsed.max_new_tokens)


def _parse_openai_line(data: dict, chat: ChatRenderer | None) -> ParsedLine:
    try:
        parsed = RequestLine.model_validate(data)
    except ValidationError as exc:
        raise _describe_validation_error(exc, InputFormat.OPENAI) from exc
    try:
        prompt = request_prompt(parsed, chat)
    except ChatTemplateError as exc:
        raise LineProblem(str(exc), "body.messages") from exc
    prompt_field = "body.prompt" if parsed.body.prompt is not None else "body.messages"
    return ParsedLine(
        prompt,
        parsed.custom_id,
        parsed.max_new_tokens,
        endpoint=parsed.body.endpoint,
        id_field="custom_id",
        prompt_field=prompt_field,
        max_new_tokens_field=parsed.max_new_tokens_field,
    )


def _check_storable(value: str | None, field: str) -> None:
    """Postgres text cannot hold NUL characters, which JSON's \\u0000 allows (pydantic refuses surrogates)."""
    if value is not None and "\x00" in value:
        raise LineProblem(f"field '{field}': must not contain NUL characters (\\u0000)", field)


def _read_lines(stream: BinaryIO, limits: InputLimits) -> Iterator[tuple[int, bytes | None]]:
    """Yield (line number, raw bytes), or (line number, None) for a line over the size limit."""
    number = 0
    consumed = 0
    while True:
        raw = stream.readline(limits.max_line_bytes + 1)
        if not raw:
            return
        number += 1
        consumed += len(raw)
        if len(raw) > limits.max_line_bytes and not raw.endswith(b"\n"):
            # Too long: skip to the end of this line without holding it in memory.
            while raw and not raw.endswith(b"\n"):
                raw = stream.readline(limits.max_line_bytes + 1)
                consumed += len(raw)
                if consumed > limits.max_file_bytes:
                    raise _FileTooLarge
            yield number, None
            continue
        if consumed > limits.max_file_bytes:
            raise _FileTooLarge
        yield number, raw


def _json_error(exc: json.JSONDecodeError, text: str, *, last_line: bool) -> str:
    message = f"invalid JSON: {exc.msg} (column {exc.colno})"
    ends_early = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated")
    if last_line and ends_early:
        message += "; the file ends in the middle of this line (truncated?)"
    return message


def _parse_line(
    text: str, fmt: InputFormat, limits: InputLimits, chat: ChatRenderer | None, *, last_line: bool
) -> ParsedLine:
    """Parse one line; ``last_line``: it has no newline, so the file ends with it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LineProblem(_json_error(exc, text, last_line=last_line)) from exc
    if not isinstance(data, dict):
        raise LineProblem(f"expected a JSON object, got {_json_type(data)}")
    parsed = _parse_genjob_line(data) if fmt is InputFormat.GENJOB else _parse_openai_line(data, chat)
    tokens = parsed.max_new_tokens
    if tokens is not None and not 1 <= tokens <= limits.max_new_tokens_limit:
        field = parsed.max_new_tokens_field
        raise LineProblem(
            f"field '{field}': must be between 1 and {limits.max_new_tokens_limit}, got {tokens}", field
        )
    _check_storable(parsed.prompt, parsed.prompt_field)
    _check_storable(parsed.custom_id, parsed.id_field)
    return parsed


def _parse_stream(
    stream: BinaryIO,
    limits: InputLimits,
    fmt: InputFormat,
    chat: ChatRenderer | None,
    check: PromptCheck | None = None,
) -> Iterator[PromptItem | LineError]:
    try:
        yield from _parse_lines(stream, limits, fmt, chat, check)
    except _FileTooLarge:
        yield LineError(None, file_too_large_message(None, limits.max_file_bytes))


def _parse_lines(
    stream: BinaryIO,
    limits: InputLimits,
    fmt: InputFormat,
    chat: ChatRenderer | None,
    check: PromptCheck | None,
) -> Iterator[PromptItem | LineError]:
    seen_ids: set[str] = set()
    endpoint: tuple[OpenAIEndpoint, int] | None = None  # the file's endpoint, and its first line
    seq = 0
    for number, raw in _read_lines(stream, limits):
        if raw is None:
            yield LineError(number, f"line is longer than the limit of {limits.max_line_bytes} bytes")
            continue
        if number == 1 and raw.startswith(UTF16_BOMS):
            yield LineError(
                number, f"the file is UTF-16 (byte order mark {raw[:2].hex(' ')}); save it as UTF-8"
            )
            return
        if number == 1 and raw.startswith(UTF8_BOM):
            raw = raw[len(UTF8_BOM) :]
        try:
            text = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            yield LineError(number, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})")
            continue
        if not text.strip():
            continue  # blank lines (and a trailing newline) are allowed
        try:
            parsed = _parse_line(text, fmt, limits, chat, last_line=not raw.endswith(b"\n"))
        except LineProblem as problem:
            yield LineError(number, problem.message, problem.field)
            continue
        if parsed.endpoint is not None:
            if endpoint is None:
                endpoint = (parsed.endpoint, number)
            elif parsed.endpoint is not endpoint[0]:
                yield LineError(
                    number,
                    f"a {parsed.endpoint.value} request in a file of {endpoint[0].value} requests "
                    f"(line {endpoint[1]}): a batch uses one endpoint",
                    parsed.prompt_field,
                )
                continue
        if parsed.custom_id is not None:
            if parsed.custom_id in seen_ids:
                field = parsed.id_field
                yield LineError(number, f"field '{field}': duplicate id {parsed.custom_id!r}", field)
                continue
            seen_ids.add(parsed.custom_id)
        item = PromptItem(
            seq, number, parsed.prompt, parsed.custom_id, parsed.max_new_tokens, parsed.endpoint
        )
        problem = check(item) if check is not None else None
        if problem is not None:
            yield LineError(number, problem, parsed.prompt_field)
            continue
        yield item
        seq += 1


@dataclass(frozen=True)
class InputSummary:
    count: int
    endpoint: OpenAIEndpoint | None  # the OpenAI endpoint every line used; None for genjob lines


def summarize_prompt_stream(
    stream: BinaryIO,
    *,
    source: str,
    limits: InputLimits,
    input_format: InputFormat = InputFormat.GENJOB,
    chat: ChatRenderer | None = None,
    check: PromptCheck | None = None,
) -> InputSummary:
    """Check every line; return the number of prompts (and endpoint) or raise ``InputFileError``.

    ``check`` adds a test of each prompt (``model_context_check``), run on valid lines only.
    """
    errors: list[LineError] = []
    more = 0
    count = 0
    endpoint = None
    for entry in _parse_stream(stream, limits, input_format, chat, check):
        if isinstance(entry, LineError):
            if len(errors) < MAX_REPORTED_ERRORS:
                errors.append(entry)
            else:
                more += 1
        else:
            count += 1
            endpoint = entry.endpoint
    if not errors and count == 0:
        errors.append(LineError(None, "no prompts found (the file is empty or has only blank lines)"))
    if errors:
        raise InputFileError(source, errors, more=more)
    return InputSummary(count, endpoint)


def validate_prompt_stream(
    stream: BinaryIO,
    *,
    source: str,
    limits: InputLimits,
    input_format: InputFormat = InputFormat.GENJOB,
    chat: ChatRenderer | None = None,
    check: PromptCheck | None = None,
) -> int:
    """Check every line; return the number of prompts or raise ``InputFileError``."""
    summary = summarize_prompt_stream(
        stream, source=source, limits=limits, input_format=input_format, chat=chat, check=check
    )
    return summary.count


def iter_prompt_stream(
    stream: BinaryIO,
    *,
    source: str,
    limits: InputLimits,
    input_format: InputFormat = InputFormat.GENJOB,
    chat: ChatRenderer | None = None,
) -> Iterator[PromptItem]:
    """Yield the prompts of an already validated stream; raise on the first error regardless."""
    for entry in _parse_stream(stream, limits, input_format, chat):
        if isinstance(entry, LineError):
            raise InputFileError(source, [entry])
        yield entry


def check_file_size(path: Path, *, limits: InputLimits) -> None:
    """Refuse a file over the limit from its size alone, before reading a byte of it."""
    size = path.stat().st_size
    if size > limits.max_file_bytes:
        raise InputFileError(
            str(path), [LineError(None, file_too_large_message(size, limits.max_file_bytes))]
        )


def validate_prompt_file(
    path: Path,
    *,
    limits: InputLimits,
    input_format: InputFormat = InputFormat.GENJOB,
    chat: ChatRenderer | None = None,
    check: PromptCheck | None = None,
) -> int:
    check_file_size(path, limits=limits)
    with path.open("rb") as stream:
        return validate_prompt_stream(
            stream, source=str(path), limits=limits, input_format=input_format, chat=chat, check=check
        )


def iter_prompt_file(
    path: Path,
    *,
    limits: InputLimits,
    input_format: InputFormat = InputFormat.GENJOB,
    chat: ChatRenderer | None = None,
) -> Iterator[PromptItem]:
    with path.open("rb") as stream:
        yield from iter_prompt_stream(
            stream, source=str(path), limits=limits, input_format=input_format, chat=chat
        )


def model_context_check(model: str, *, max_new_tokens: int) -> PromptCheck | None:
    """A check that prompt + max_new_tokens fits the model's context, if ``model`` is a local
    directory with a ``config.json`` and a fast ``tokenizer.json``; None otherwise (then the
    worker checks each item and fails the long ones with PromptTooLong)."""
    directory = Path(model)
    config_file, tokenizer_file = directory / "config.json", directory / "tokenizer.json"
    if not (config_file.is_file() and tokenizer_file.is_file()):
        return None
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception:
        return None  # unreadable here: the worker will tell
    context = config.get("n_positions") or config.get("max_position_embeddings")
    if not isinstance(context, int):
        return None

    def check(item: PromptItem) -> str | None:
        tokens = len(tokenizer.encode(item.prompt).ids)
        budget = item.max_new_tokens or max_new_tokens
        if tokens + budget <= context:
            return None
        return (
            f"field 'prompt': {tokens} tokens + max_new_tokens {budget} exceeds the context of "
            f"{context} tokens of model {model}"
        )

    return check
