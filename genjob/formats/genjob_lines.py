"""genjob's own line format: ``{"prompt": "...", "id": "optional", "max_new_tokens": optional}``.

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


def parse_genjob_line(data: dict[str, Any]) -> ParsedLine:
    try:
        parsed = PromptLine.model_validate(data)
    except ValidationError as exc:
        raise describe_validation_error(exc, GENJOB_FIELDS) from exc
    return ParsedLine(parsed.prompt, parsed.id, parsed.max_new_tokens)
