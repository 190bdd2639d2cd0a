"""``genjob submit``'s job options, generated from the fields of ``genjob.options.JobOptions``.

Each field becomes ``--field-name`` with the field's help and default; an enum becomes a choice, a
number with a range an IntRange or FloatRange, and what a click type cannot say (a string's length
or characters) is checked by the field itself. Only the short flags are the CLI's own.
Must not know: the database, the workers.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, TypeVar, Union, cast, get_args, get_origin

import annotated_types
import click
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from genjob.options import DecodingOptions, JobOptions

F = TypeVar("F", bound=Callable[..., Any])

SHORT_FLAGS = {"model": "-m", "assistant": "-a"}


def job_options(model: type[BaseModel] = JobOptions) -> Callable[[F], F]:
    """A decorator adding one click option per field of ``model`` (the submit's own fields first)."""
    options = [_option(name, field) for name, field in _ordered(model)]

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def option_values(values: dict[str, Any], model: type[BaseModel] = JobOptions) -> dict[str, Any]:
    """Pop ``model``'s options from a command's keyword arguments, leaving out the unset ones."""
    return {name: value for name in model.model_fields if (value := values.pop(name, None)) is not None}


def _ordered(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    fields = list(model.model_fields.items())
    return sorted(fields, key=lambda item: item[0] in DecodingOptions.model_fields)


def _option(name: str, field: FieldInfo) -> Callable[[F], F]:
    annotation = _without_none(field.annotation)
    flags = [flag for flag in (SHORT_FLAGS.get(name), "--" + name.replace("_", "-")) if flag]
    default = None if field.is_required() or field.default is None else field.default
    if isinstance(default, enum.Enum):
        default = default.value
    param_type = _param_type(annotation, field.metadata)
    checked = annotation is str and bool(field.metadata)
    # No default at all rather than default=None: click 8.3 takes an explicit None for a value given,
    # so a required option left out would reach the model (pydantic's "Field required", exit 1)
    # instead of click's usage error (exit 2).
    defaults = {} if default is None else {"default": default, "show_default": True}
    return click.option(
        *flags,
        name,
        type=param_type,
        required=field.is_required(),
        help=field.description,
        callback=_field_check(name, field) if checked else None,
        **defaults,
    )


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _param_type(annotation: Any, metadata: Sequence[Any]) -> click.ParamType:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return click.Choice([member.value for member in annotation])
    bounds = dict(_bounds(metadata))
    if annotation is int:
        return click.IntRange(**bounds) if bounds else click.INT
    if annotation is float:
        return click.FloatRange(**bounds) if bounds else click.FLOAT
    if annotation is str:
        return click.STRING
    raise TypeError(f"no click type for job option type {annotation!r}")


def _bounds(metadata: Sequence[Any]) -> Iterator[tuple[str, Any]]:
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            yield "min", item.ge
        elif isinstance(item, annotated_types.Gt):
            yield from (("min", item.gt), ("min_open", True))
        elif isinstance(item, annotated_types.Le):
            yield "max", item.le
        elif isinstance(item, annotated_types.Lt):
            yield from (("max", item.lt), ("max_open", True))


def _field_check(name: str, field: FieldInfo) -> Callable[[click.Context, click.Parameter, Any], Any]:
    adapter: TypeAdapter[Any] = TypeAdapter(cast(Any, Annotated[field.annotation, *field.metadata]))

    def check(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is None:
            return value
        try:
            return adapter.validate_python(value)
        except ValidationError as exc:
            raise click.BadParameter("; ".join(error["msg"] for error in exc.errors())) from exc

    return check
