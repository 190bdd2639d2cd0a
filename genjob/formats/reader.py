"""Read a prompt file (JSONL): the one streaming reader, shared by the CLI and the HTTP API.

``read_prompts`` walks a binary stream line by line (``genjob.formats.lines``), parses each line in
its format (genjob's own, ``genjob.formats.genjob_lines``, or OpenAI batch requests,
``genjob.formats.openai_lines``, whose chat messages the ``SubmitTokenizer`` renders to text), checks
it against the file's ``LineChecks`` (given once, whichever function reads) and yields a
``PromptItem`` or a ``LineError`` naming the line and field. ``check_prompts`` reads a
whole stream (raising ``InputFileError`` with the first problems); ``valid_prompts`` yields the
items of a stream as its insert consumes them, and raises at its first bad line.
Must not know: the database, Celery, torch, HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from genjob.constants import InputFormat, OpenAIEndpoint
from genjob.formats.genjob_lines import parse_genjob_json, parse_genjob_line
from genjob.formats.lines import (
    UTF8_BOM,
    FileTooLarge,
    InputFileError,
    InputLimits,
    LineError,
    LineProblem,
    ParsedLine,
    PromptItem,
    byte_order_mark,
    check_storable,
    file_too_large_message,
    json_type,
    parse_json_line,
    read_lines,
)
from genjob.formats.openai_lines import parse_openai_line
from genjob.formats.tokenizing import SubmitTokenizer
from genjob.options import line_or_job, max_new_tokens_problem

MAX_REPORTED_ERRORS = 20


def _parse_line(
    text: str, fmt: InputFormat, tokenizer: SubmitTokenizer | None, *, last_line: bool
) -> ParsedLine:
    """Parse one line, checked; ``last_line``: it has no newline, so the file ends with it."""
    data = parse_json_line(text, last_line=last_line)
    if not isinstance(data, dict):
        raise LineProblem(f"expected a JSON object, got {json_type(data)}")
    return parse_genjob_line(data) if fmt is InputFormat.GENJOB else parse_openai_line(data, tokenizer)


def _check_line(parsed: ParsedLine, limits: InputLimits) -> None:
    """The checks every format shares, on a parsed line."""
    tokens = parsed.max_new_tokens
    problem = max_new_tokens_problem(tokens, limits.max_new_tokens_limit) if tokens is not None else None
    if problem is not None:
        field = parsed.max_new_tokens_field
        raise LineProblem(f"field '{field}': {problem}", field)
    check_storable(parsed.prompt, parsed.prompt_field)
    check_storable(parsed.custom_id, parsed.id_field)


@dataclass(frozen=True)
class LineChecks:
    """What every line of a file is read and checked against. With a ``tokenizer`` and
    ``max_new_tokens`` (the job's), each valid prompt is also checked against the model's context.
    With ``model`` and ``endpoint`` (the Batches API), every OpenAI line must name that model in
    ``body.model`` and be a request for that endpoint."""

    limits: InputLimits = field(default_factory=InputLimits)
    input_format: InputFormat = InputFormat.GENJOB
    tokenizer: SubmitTokenizer | None = None
    max_new_tokens: int | None = None
    model: str | None = None
    endpoint: OpenAIEndpoint | None = None


def read_prompts(
    stream: BinaryIO, checks: LineChecks, *, duplicate_ids: bool = True
) -> Iterator[PromptItem | LineError]:
    """Every line's item or error, in order. ``duplicate_ids``: refuse an id seen on an earlier line
    (this keeps every id in memory; ``genjob.submit`` leaves it to the database's unique index, and
    asks for it only to report a file it refused)."""
    try:
        yield from _read(stream, checks, duplicate_ids)
    except FileTooLarge:
        yield LineError(None, file_too_large_message(None, checks.limits.max_file_bytes))


def _read(stream: BinaryIO, checks: LineChecks, duplicate_ids: bool) -> Iterator[PromptItem | LineError]:
    limits, fmt, tokenizer, model = checks.limits, checks.input_format, checks.tokenizer, checks.model
    max_new_tokens, batch_endpoint = checks.max_new_tokens, checks.endpoint
    seen_ids: set[str] = set()
    # the file's endpoint, and its first line (0: the batch's, given)
    endpoint = (batch_endpoint, 0) if batch_endpoint is not None else None
    seq = 0
    for number, raw in read_lines(stream, limits):
        if raw is None:
            yield LineError(number, f"line is longer than the limit of {limits.max_line_bytes} bytes")
            continue
        encoding = byte_order_mark(raw) if number == 1 else None
        if encoding is not None:
            mark = raw[: 4 if encoding == "UTF-32" else 2].hex(" ")
            yield LineError(number, f"the file is {encoding} (byte order mark {mark}); save it as UTF-8")
            return
        if b"\x00" in raw:  # JSON text never holds a raw NUL byte: another encoding, or not text
            yield LineError(
                number,
                "NUL bytes: the file looks like UTF-16 or UTF-32 without a byte order mark, or binary "
                "data; save it as UTF-8",
            )
            return
        if number == 1 and raw.startswith(UTF8_BOM):
            raw = raw[len(UTF8_BOM) :]
        # the fast path for genjob lines; the checked parse when it is unsure (and to name a problem)
        parsed = parse_genjob_json(raw) if fmt is InputFormat.GENJOB else None
        try:
            if parsed is None:
                try:
                    text = raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as exc:
                    raise LineProblem(
                        f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
                    ) from None
                if not text.strip():
                    continue  # blank lines (and a trailing newline) are allowed
                parsed = _parse_line(text, fmt, tokenizer, last_line=not raw.endswith(b"\n"))
            _check_line(parsed, limits)
        except LineProblem as problem:
            yield LineError(number, problem.message, problem.field)
            continue
        if model is not None and parsed.model != model:
            named = f"names {parsed.model!r}" if parsed.model is not None else "names no model"
            yield LineError(
                number,
                f"field 'body.model': the line {named}; every line of a batch names {model!r}",
                "body.model",
            )
            continue
        if parsed.endpoint is not None:
            if endpoint is None:
                endpoint = (parsed.endpoint, number)
            elif parsed.endpoint is not endpoint[0]:
                where = f"a file of {endpoint[0].value} requests (line {endpoint[1]})"
                if endpoint[1] == 0:
                    where = f"a batch for {endpoint[0].value}"
                yield LineError(
                    number,
                    f"a {parsed.endpoint.value} request in {where}: a batch uses one endpoint",
                    parsed.prompt_field,
                )
                continue
        if parsed.custom_id is not None and duplicate_ids:
            if parsed.custom_id in seen_ids:
                field = parsed.id_field
                yield LineError(number, f"field '{field}': duplicate id {parsed.custom_id!r}", field)
                continue
            seen_ids.add(parsed.custom_id)
        item = PromptItem(
            seq,
            number,
            parsed.prompt,
            parsed.custom_id,
            parsed.max_new_tokens,
            parsed.endpoint,
            parsed.sampling,
        )
        too_long = None
        if tokenizer is not None and max_new_tokens is not None:
            too_long = tokenizer.context_problem(
                item.prompt, line_or_job(item.max_new_tokens, max_new_tokens)
            )
        if too_long is not None:
            yield LineError(number, f"field '{parsed.prompt_field}': {too_long}", parsed.prompt_field)
            continue
        yield item
        seq += 1


@dataclass(frozen=True)
class InputSummary:
    count: int
    endpoint: OpenAIEndpoint | None  # the OpenAI endpoint every line used; None for genjob lines


def check_prompts(
    stream: BinaryIO, checks: LineChecks, *, source: str, duplicate_ids: bool = True
) -> InputSummary:
    """Check every line; return the number of prompts (and endpoint) or raise ``InputFileError``."""
    errors: list[LineError] = []
    more = 0
    count = 0
    endpoint = checks.endpoint
    for entry in read_prompts(stream, checks, duplicate_ids=duplicate_ids):
        if isinstance(entry, LineError):
            if len(errors) < MAX_REPORTED_ERRORS:
                errors.append(entry)
            else:
                more += 1
        else:
            count += 1
            endpoint = entry.endpoint or endpoint
    if not errors and count == 0:
        errors.append(LineError(None, "no prompts found (the file is empty or has only blank lines)"))
    if errors:
        raise InputFileError(source, errors, more=more)
    return InputSummary(count, endpoint)


def valid_prompts(stream: BinaryIO, checks: LineChecks, *, source: str) -> Iterator[PromptItem]:
    """The prompts of a stream, checked as ``check_prompts`` checks them except for duplicate ids (the
    database's unique index finds those); raises ``InputFileError`` at the first bad line."""
    for entry in read_prompts(stream, checks, duplicate_ids=False):
        if isinstance(entry, LineError):
            raise InputFileError(source, [entry])
        yield entry


def first_line_model(stream: BinaryIO, *, limits: InputLimits) -> tuple[int, str | LineError | None] | None:
    """(line number, ``body.model``) of the first non-blank line of OpenAI request lines, the stream
    rewound; None for a file with no such line. A line that does not parse gives its ``LineError``
    instead of a model (the same words as the full check's); one that names none, None."""
    start = stream.tell()
    try:
        for number, raw in read_lines(stream, limits):
            if raw is None:
                return number, None
            text = raw.removeprefix(UTF8_BOM).decode("utf-8", errors="replace").strip()
            if not text:
                continue
            try:
                data = parse_json_line(text, last_line=False)
            except LineProblem as problem:
                return number, LineError(number, problem.message, problem.field)
            body = data.get("body") if isinstance(data, dict) else None
            model = body.get("model") if isinstance(body, dict) else None
            return number, model if isinstance(model, str) else None
        return None
    except FileTooLarge:
        return None
    finally:
        stream.seek(start)
