"""Which models a job may run (the allow-list in Settings, ``GENJOB_MODELS``), and JobOptions → JobSpec.

Shared by the CLI and the API so that both build the same job from the same options. A name from
the allow-list resolves to its target and draft; the API accepts nothing else (a job cannot point
the workers at an arbitrary path), the CLI, run by whoever runs the workers, also accepts paths.
Must not know: click, FastAPI, torch, the workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from genjob.constants import DecodingMode
from genjob.options import JobOptions, JobSpec
from genjob.settings import ModelEntry, Settings


class JobOptionsError(ValueError):
    """Job options that cannot make a job: an unknown model, or values out of range."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    @classmethod
    def of(cls, errors: Iterable[Mapping[str, Any]]) -> JobOptionsError:
        """From pydantic's error dicts (``loc`` relative to the options): every problem, named by
        its option, in one message; ``field`` is the first problem's option."""
        errors = list(errors)
        problems = "; ".join(_describe(error) for error in errors)
        return cls(problems, field=_field(errors[0]["loc"]) if errors else None)


def parse_job_options(options: Mapping[str, Any]) -> JobOptions:
    """JobOptions from keyword values, or JobOptionsError naming the options that are wrong."""
    try:
        return JobOptions.model_validate(options)
    except ValidationError as exc:
        raise JobOptionsError.of(exc.errors()) from exc


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


def job_spec(settings: Settings, options: JobOptions, *, allow_paths: bool) -> JobSpec:
    """The JobSpec of these options, with the defaults the CLI and the API share.

    The draft is ``assistant`` if given (an allow-list name or, with ``allow_paths``, a path), else
    the model's allow-listed draft unless ``mode`` asks for another decoding. ``mode`` defaults to
    ``draft`` when there is a draft, ``none`` otherwise; ``max_new_tokens`` to GENJOB_MAX_NEW_TOKENS.
    """
    entry = resolve_model(settings, options.model, allow_paths=allow_paths)
    assistant: str | None = None
    if options.assistant is not None:
        assistant = resolve_model(settings, options.assistant, allow_paths=allow_paths).target
    elif options.mode in (None, DecodingMode.DRAFT):
        assistant = entry.draft
    mode = options.mode or (DecodingMode.DRAFT if assistant else DecodingMode.NONE)
    max_new_tokens = options.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = settings.max_new_tokens
    if not 1 <= max_new_tokens <= settings.max_new_tokens_limit:
        raise JobOptionsError(
            f"max_new_tokens must be between 1 and {settings.max_new_tokens_limit}, got {max_new_tokens}",
            field="max_new_tokens",
        )
    try:
        return JobSpec(
            model=entry.target,
            assistant=assistant,
            mode=mode,
            max_new_tokens=max_new_tokens,
            **options.decoding(),
        )
    except ValidationError as exc:
        raise JobOptionsError.of(exc.errors()) from exc


def build_job_spec(settings: Settings, *, allow_paths: bool, **options: Any) -> JobSpec:
    """``job_spec`` from keyword options (``model=...``, ``mode=...``), checked by JobOptions."""
    return job_spec(settings, parse_job_options(options), allow_paths=allow_paths)


def _field(loc: Sequence[Any]) -> str | None:
    return ".".join(str(part) for part in loc) or None


def _describe(error: Mapping[str, Any]) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    field = _field(error["loc"])
    return f"{field}: {message}" if field else message
