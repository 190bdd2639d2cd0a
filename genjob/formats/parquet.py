"""A job's results as a Parquet file (pyarrow), written in row groups of ``ROW_GROUP`` records.

The columns are the records of ``genjob.formats.export`` with fixed types (so an all-null column, or
a job with no results yet, keeps its type). pyarrow is an optional dependency (``genjob[parquet]``,
in ``genjob[api]`` too); without it ``ParquetUnavailable`` says what to install.
Must not know: the CLI, HTTP, torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, BinaryIO

from genjob.formats.export import RESULT_FIELDS

ROW_GROUP = 10_000
COLUMN_TYPES = {
    "id": "string",
    "index": "int64",
    "line": "int64",
    "status": "string",
    "output": "string",
    "finish_reason": "string",
    "mode": "string",
    "prompt_tokens": "int64",
    "new_tokens": "int64",
    "target_rounds": "int64",
    "draft_proposed": "int64",
    "draft_accepted": "int64",
    "latency_s": "float64",
    "looping": "bool_",
    "error": "string",
}
assert tuple(COLUMN_TYPES) == RESULT_FIELDS


class ParquetUnavailable(RuntimeError):
    """pyarrow is not installed."""


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise ParquetUnavailable("Parquet export needs pyarrow: pip install 'genjob[parquet]'") from exc
    return pyarrow


def write_parquet(records: Iterable[dict[str, Any]], sink: BinaryIO) -> int:
    """Write the records to ``sink`` as one Parquet file; returns how many."""
    pa = _pyarrow()
    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in COLUMN_TYPES.items()])
    count = 0
    with pa.parquet.ParquetWriter(sink, schema) as writer:
        batch: list[dict[str, Any]] = []
        for record in records:
            batch.append(record)
            if len(batch) == ROW_GROUP:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count += len(batch)
                batch = []
        if batch or not count:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            count += len(batch)
    return count
