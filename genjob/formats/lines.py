"""The low level of reading a prompt file: bounded binary lines, encodings, and the error types.

A file is read line by line in binary, never whole: the file and each line are bounded in size
(``InputLimits``), each line is decoded as strict UTF-8. Errors carry the line and the field.
Must not know: the database, Celery, torch, HTTP.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from pydantic import ValidationError

from genjob.constants import OpenAIEndpoint
from genjob.options import MAX_NEW_TOKENS_LIMIT

UTF8_BOM = b"\xef\xbb\xbf"
# UTF-32 first: its little-endian mark starts with UTF-16's.
BYTE_ORDER_MARKS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)
# A JSON line is refused, not parsed, past these (Python's parser recurses per level, and converting
# a number of thousands of digits is quadratic): no prompt file needs more.
MAX_JSON_DEPTH = 64
MAX_NUMBER_DIGITS = 100
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


@dataclass(frozen=True, slots=True)
class LineSampling:
    """A line's own sampling settings (OpenAI request lines); None: the job's."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class PromptItem:
    seq: int  # position among the file's prompts, from 0
    line: int  # 1-based line number in the file
    prompt: str
    custom_id: str | None
    max_new_tokens: int | None
    endpoint: OpenAIEndpoint | None = None  # OpenAI request lines only
    sampling: LineSampling | None = None  # OpenAI request lines only


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
    sampling: LineSampling | None = None
    model: str | None = None  # body.model of an OpenAI request line


@dataclass(frozen=True)
class InputLimits:
    max_line_bytes: int = 1 << 20
    max_new_tokens_limit: int = MAX_NEW_TOKENS_LIMIT
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


def byte_order_mark(raw: bytes) -> str | None:
    """The encoding a first line's byte order mark names, when it is not UTF-8's."""
    return next((name for mark, name in BYTE_ORDER_MARKS if raw.startswith(mark)), None)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: an object naming a key twice is refused (JSON would keep the last)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise LineProblem(f"invalid JSON: duplicate key {key!r} (only one value may be given)", key)
        data[key] = value
    return data


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_NUMBER_DIGITS:
        raise LineProblem(
            f"invalid JSON: a number of {len(digits.lstrip('-'))} digits (at most {MAX_NUMBER_DIGITS})"
        )
    return int(digits)


def _bounded_float(text: str) -> float:
    if len(text) > MAX_NUMBER_DIGITS * 2:
        limit = MAX_NUMBER_DIGITS * 2
        raise LineProblem(f"invalid JSON: a number of {len(text)} characters (at most {limit})")
    return float(text)


def _not_json(constant: str) -> Any:
    raise LineProblem(f"invalid JSON: {constant} is not a JSON value")


def _check_depth(text: str) -> None:
    """Refuse arrays and objects nested deeper than MAX_JSON_DEPTH before the parser recurses into them."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return
    depth = 0
    for bracket in _JSON_BRACKET.finditer(_JSON_STRING.sub('""', text)):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            raise LineProblem(f"invalid JSON: arrays or objects nested deeper than {MAX_JSON_DEPTH} levels")


def parse_json_line(text: str, *, last_line: bool) -> Any:
    """One line's JSON value, or LineProblem: invalid JSON, a duplicate key, nesting deeper than
    MAX_JSON_DEPTH, a number longer than MAX_NUMBER_DIGITS, NaN or Infinity."""
    _check_depth(text)
    try:
        return json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_int=_bounded_int,
            parse_float=_bounded_float,
            parse_constant=_not_json,
        )
    except LineProblem:
        raise
    except json.JSONDecodeError as exc:
        raise LineProblem(json_error(exc, text, last_line=last_line)) from exc
    except RecursionError as exc:  # a parser with a smaller stack than the depth check allows for
        raise LineProblem("invalid JSON: arrays or objects nested too deeply") from exc
    except ValueError as exc:
        raise LineProblem(f"invalid JSON: {exc}") from exc


def json_error(exc: json.JSONDecodeError, text: str, *, last_line: bool) -> str:
    message = f"invalid JSON: {exc.msg} (column {exc.colno})"
    ends_early = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated")
    if last_line and ends_early:
        message += "; the file ends in the middle of this line (truncated?)"
    return message
