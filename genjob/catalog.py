"""Which models a job may run: the allow-list in Settings (``GENJOB_MODELS``), and job options → JobSpec.

Shared by the CLI and the API so that both build the same job from the same options. A name from
the allow-list resolves to its target and draft; the API accepts nothing else (a job cannot point
the workers at an arbitrary path), the CLI, run by whoever runs the workers, also accepts paths.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from genjob.constants import DecodingMode
from genjob.options import JobSpec
from genjob.settings import ModelEntry, Settings


class JobOptionsError(ValueError):
    """Job options that cannot make a job: an unknown model, or values out of range."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def resolve_model(settings: Settings, name: str, *, allow_paths: bool) -> ModelEntry:
    """The allow-list entry called ``name``; else, if ``allow_paths``, ``name`` itself as a target."""
    entry = settings.model_entry(name)
    if entry is not None:
        return entry
    if not allow_paths:
        names = ", ".join(e.name for e in settings.models)
        known = f"one of: {names}" if names else "none are configured (GENJOB_MODELS)"
        raise JobOptionsError(
            f"unknown model {name!r}: models are named from the allow-list, {known}", field="model"
        )
    return ModelEntry.model_construct(name=name, target=name, draft=None)  # a path, not a listed name


def build_job_spec(
    settings: Settings,
    *,
    model: str,
    assistant: str | None = None,
    mode: DecodingMode | str | None = None,
    max_new_tokens: int | None = None,
    allow_paths: bool,
    **options: Any,
) -> JobSpec:
    """A JobSpec from submit options, with the defaults the CLI and the API share.

    The draft is ``assistant`` if given (an allow-list name or, with ``allow_paths``, a path), else
    the model's allow-listed draft unless ``mode`` asks for another decoding. ``mode`` defaults to
    ``draft`` when there is a draft, ``none`` otherwise.
    """
    entry = resolve_model(settings, model, allow_paths=allow_paths)
    if assistant is not None:
        assistant = resolve_model(settings, assistant, allow_paths=allow_paths).target
    elif mode in (None, DecodingMode.DRAFT):
        assistant = entry.draft
    if mode is None:
        mode = DecodingMode.DRAFT if assistant else DecodingMode.NONE
    if max_new_tokens is None:
        max_new_tokens = settings.max_new_tokens
    if not 1 <= max_new_tokens <= settings.max_new_tokens_limit:
        raise JobOptionsError(
            f"max_new_tokens must be between 1 and {settings.max_new_tokens_limit}, got {max_new_tokens}",
            field="max_new_tokens",
        )
    try:
        return JobSpec(
            model=entry.target, assistant=assistant, mode=mode, max_new_tokens=max_new_tokens, **options
        )
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        field = ".".join(str(part) for part in exc.errors()[0]["loc"]) or None
        raise JobOptionsError(problems, field=field) from exc


def _describe(error: Any) -> str:
    message = error["msg"].removeprefix("Value error, ")
    field = ".".join(str(part) for part in error["loc"])
    return f"{field}: {message}" if field else message
