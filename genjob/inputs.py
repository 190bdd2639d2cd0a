"""Streaming validation of prompt files (JSONL), shared by the CLI and the HTTP API.

A file is read line by line in binary, never whole: each line is bounded in size, decoded as
strict UTF-8, parsed as a JSON object and validated field by field. Errors name the file, the
line and the field. ``validate_prompt_file`` checks a whole file before anything is stored;
``iter_prompt_file`` yields the valid items for the insert that follows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator

UTF8_BOM = b"\xef\xbb\xbf"
MAX_REPORTED_ERRORS = 20


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


@dataclass(frozen=True)
class InputLimits:
    max_line_bytes: int = 1 << 20
    max_new_tokens_limit: int = 8192


def _json_type(value: object) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _describe_validation_error(exc: ValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    kind = first["type"]
    if kind == "missing":
        return f"missing required field '{field}'", field
    if kind == "extra_forbidden":
        return f"unknown field '{field}' (allowed: prompt, id, max_new_tokens)", field
    message = first["msg"].removeprefix("Value error, ")
    return f"field '{field}': {message}", field


def _read_lines(stream: BinaryIO, limits: InputLimits) -> Iterator[tuple[int, bytes | None]]:
    """Yield (line number, raw bytes), or (line number, None) for a line over the size limit."""
    number = 0
    while True:
        raw = stream.readline(limits.max_line_bytes + 1)
        if not raw:
            return
        number += 1
        if len(raw) > limits.max_line_bytes and not raw.endswith(b"\n"):
            # Too long: skip to the end of this line without holding it in memory.
            while raw and not raw.endswith(b"\n"):
                raw = stream.readline(limits.max_line_bytes + 1)
            yield number, None
            continue
        yield number, raw


def _parse_stream(stream: BinaryIO, limits: InputLimits) -> Iterator[PromptItem | LineError]:
    seen_ids: set[str] = set()
    seq = 0
    for number, raw in _read_lines(stream, limits):
        if raw is None:
            yield LineError(number, f"line is longer than the limit of {limits.max_line_bytes} bytes")
            continue
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
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            yield LineError(number, f"invalid JSON: {exc.msg} (column {exc.colno})")
            continue
        if not isinstance(data, dict):
            yield LineError(number, f"expected a JSON object, got {_json_type(data)}")
            continue
        try:
            parsed = PromptLine.model_validate(data)
        except ValidationError as exc:
            message, field = _describe_validation_error(exc)
            yield LineError(number, message, field)
            continue
        if (
            parsed.max_new_tokens is not None
            and not 1 <= parsed.max_new_tokens <= limits.max_new_tokens_limit
        ):
            yield LineError(
                number,
                f"field 'max_new_tokens': must be between 1 and {limits.max_new_tokens_limit}, "
                f"got {parsed.max_new_tokens}",
                "max_new_tokens",
            )
            continue
        if parsed.id is not None:
            if parsed.id in seen_ids:
                yield LineError(number, f"field 'id': duplicate id {parsed.id!r}", "id")
                continue
            seen_ids.add(parsed.id)
        yield PromptItem(seq, number, parsed.prompt, parsed.id, parsed.max_new_tokens)
        seq += 1


def validate_prompt_stream(stream: BinaryIO, *, source: str, limits: InputLimits) -> int:
    """Check every line; return the number of prompts or raise ``InputFileError``."""
    errors: list[LineError] = []
    more = 0
    count = 0
    for entry in _parse_stream(stream, limits):
        if isinstance(entry, LineError):
            if len(errors) < MAX_REPORTED_ERRORS:
                errors.append(entry)
            else:
                more += 1
        else:
            count += 1
    if not errors and count == 0:
        errors.append(LineError(None, "no prompts found (the file is empty or has only blank lines)"))
    if errors:
        raise InputFileError(source, errors, more=more)
    return count


def iter_prompt_stream(stream: BinaryIO, *, source: str, limits: InputLimits) -> Iterator[PromptItem]:
    """Yield the prompts of an already validated stream; raise on the first error regardless."""
    for entry in _parse_stream(stream, limits):
        if isinstance(entry, LineError):
            raise InputFileError(source, [entry])
        yield entry


def validate_prompt_file(path: Path, *, limits: InputLimits) -> int:
    with path.open("rb") as stream:
        return validate_prompt_stream(stream, source=str(path), limits=limits)


def iter_prompt_file(path: Path, *, limits: InputLimits) -> Iterator[PromptItem]:
    with path.open("rb") as stream:
        yield from iter_prompt_stream(stream, source=str(path), limits=limits)
