"""The fields of an item's result as the exports show them, derived from the tables, declared nowhere else.

An exported record (JSONL, CSV and Parquet: ``genjob.formats.export``, ``genjob.formats.parquet``) is the
item's id, index, line and status, then the ``Result`` columns marked ``shown(export=True)`` in
``genjob.tables`` (in the table's order), then the item's error; a Parquet column's type is its SQL
column's. The ``genjob`` object of an OpenAI response body (``genjob.formats.openai_output``) holds the
columns marked ``shown(openai=True)``. A new result column is shown where its mark says, and nowhere else.
Must not know: the CLI, HTTP, Celery, torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column

from genjob.tables import Item, Result

# A column's Python type as a pyarrow type (the name of its factory: ``pyarrow.int64()``…).
ARROW_TYPES = {str: "string", int: "int64", float: "float64", bool: "bool_"}


@dataclass(frozen=True)
class ExportField:
    """One field of an exported record: ``name`` as the export calls it, read from ``column`` (of the
    item, or of its result: null while it has none), a float rounded to ``digits`` if given."""

    name: str
    column: Column[Any]
    digits: int | None = None

    @property
    def arrow_type(self) -> str:
        return ARROW_TYPES[self.column.type.python_type]

    def value(self, item: Item, result: Result | None) -> Any:
        row = item if self.column.table is Item.__table__ else result
        value = None if row is None else getattr(row, self.column.key)
        return value if self.digits is None or value is None else round(value, self.digits)


def _item_field(name: str, column: str) -> ExportField:
    return ExportField(name, Item.__mapper__.columns[column])


EXPORT_FIELDS = (
    _item_field("id", "custom_id"),
    _item_field("index", "seq"),
    _item_field("line", "line"),
    _item_field("status", "status"),
    *(
        ExportField(column.name, column, column.info["export_digits"])
        for column in Result.__mapper__.columns
        if column.info.get("export")
    ),
    _item_field("error", "error"),
)
EXPORT_NAMES = tuple(field.name for field in EXPORT_FIELDS)

OPENAI_FIELDS = tuple(column.name for column in Result.__mapper__.columns if column.info.get("openai"))


def result_record(item: Item, result: Result | None) -> dict[str, Any]:
    """An item's exported record: its fields, and its result's (null without one)."""
    return {field.name: field.value(item, result) for field in EXPORT_FIELDS}


def openai_fields(result: Result) -> dict[str, Any]:
    """The result's columns shown in an OpenAI response body's ``genjob`` object."""
    return {name: getattr(result, name) for name in OPENAI_FIELDS}
