"""The low level of reading a prompt file: bounded binary lines, encodings, and the error types.

A file is read line by line in binary, never whole: the file and each line are bounded in size
(``InputLimits``), each line is decoded as strict UTF-8. Errors carry the line and the field.
Must not know: the database, Celery, torch, HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError

from genjob.constants import OpenAIEndpoint

UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


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


class FileTooLarge(Exception):
    """The stream grew past ``max_file_bytes`` while being read."""


def file_too_large_message(size: int | None, limit: int) -> str:
    what = f"the file is {size} bytes" if size is not None else "the file is larger than that"
    return f"{what}, over the limit of {limit} bytes (GENJOB_MAX_UPLOAD_BYTES)"


def json_type(value: object) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def describe_validation_error(exc: ValidationError, allowed: str) -> LineProblem:
    """The first problem pydantic found in a line, as a message naming the field."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    kind = first["type"]
    if kind == "missing":
        return LineProblem(f"missing required field '{field}'", field)
    if kind == "extra_forbidden":
        return LineProblem(f"unknown field '{field}' (allowed: {allowed})", field)
    message = first["msg"].removeprefix("Value error, ")
    return LineProblem(f"field '{field}': {message}" if field else message, field)


def check_storable(value: str | None, field: str) -> None:
    """Postgres text cannot hold NUL characters, which JSON's \\u0000 allows (pydantic refuses surrogates)."""
    if value is not None and "\x00" in value:
        raise LineProblem(f"field '{field}': must not contain NUL characters (\\u0000)", field)


def read_lines(stream: BinaryIO, limits: InputLimits) -> Iterator[tuple[int, bytes | None]]:
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
                    raise FileTooLarge
            yield number, None
            continue
        if consumed > limits.max_file_bytes:
            raise FileTooLarge
        yield number, raw


def json_error(exc: json.JSONDecodeError, text: str, *, last_line: bool) -> str:
    message = f"invalid JSON: {exc.msg} (column {exc.colno})"
    ends_early = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated")
    if last_line and ends_early:
        message += "; the file ends in the middle of this line (truncated?)"
    return message


def check_file_size(path: Path, *, limits: InputLimits) -> None:
    """Refuse a file over the limit from its size alone, before reading a byte of it."""
    size = path.stat().st_size
    if size > limits.max_file_bytes:
        raise InputFileError(
            str(path), [LineError(None, file_too_large_message(size, limits.max_file_bytes))]
        )
