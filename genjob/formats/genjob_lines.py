"""genjob's own line format: ``{"prompt": "...", "id": "optional", "max_new_tokens": optional}``.

Two parsers give the same result: ``parse_genjob_json``, the fast path, parses and validates a line's
bytes in pydantic-core (Rust) and answers None whenever it cannot prove the line is one the checked
parse (``genjob.formats.lines.parse_json_line``, then ``parse_genjob_line``) would accept with the same
values; the reader then takes the checked parse, which names the problem.
Must not know: the database, Celery, torch, HTTP.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator

from genjob.formats.lines import ParsedLine, describe_validation_error

GENJOB_FIELDS = "prompt, id, max_new_tokens"


class PromptLine(BaseModel):
    """One input line: ``{"prompt": "...", "id": "optional", "max_new_tokens": optional}``.

    Unknown fields are rejected (a misspelt ``max_new_token`` must not be ignored silently).
    """

    model_config = ConfigDict(extra="forbid")

    prompt: StrictStr = Field(min_length=1)
    id: StrictStr | None = Field(default=None, min_length=1, max_length=200)
    max_new_tokens: StrictInt | None = None

    @field_validator("prompt", "id")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank")
        return value


_validate_json = PromptLine.__pydantic_validator__.validate_json  # model_validate_json, without its wrapper


def parse_genjob_json(raw: bytes) -> ParsedLine | None:
    """The line's content if it is a valid line with no duplicate key, None when unsure (the caller
    then parses it checked). Sound because every accepted value is a string, an int or null: nesting
    and NaN cannot pass the model, numbers pydantic-core cannot hold fail it, and jiter refuses what
    Python's parser refuses (invalid UTF-8, lone surrogates, control characters). Duplicate keys, which
    jiter accepts (the last wins), are ruled out by counting: every key is followed by a colon outside
    any string, so with no escaped colon (``\\u003a``) in the line, the colons outside the prompt and
    the id bound the number of keys, which must be the number of fields the line set."""
    try:
        line: PromptLine = _validate_json(raw)
    except ValidationError:
        return None
    colons = raw.count(b":")
    if colons != len(line.model_fields_set):
        colons -= line.prompt.count(":") + (line.id.count(":") if line.id is not None else 0)
        if colons != len(line.model_fields_set) or b"\\u003" in raw:
            return None
    return ParsedLine(line.prompt, line.id, line.max_new_tokens)


def parse_genjob_line(data: dict[str, Any]) -> ParsedLine:
    try:
        parsed = PromptLine.model_validate(data)
    except ValidationError as exc:
        raise describe_validation_error(exc, GENJOB_FIELDS) from exc
    return ParsedLine(parsed.prompt, parsed.id, parsed.max_new_tokens)
