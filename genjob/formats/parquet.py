"""A job's results as a Parquet file (pyarrow), written in row groups of ``ROW_GROUP`` records.

The columns are the exported records' (``genjob.formats.result_fields``), each typed as its SQL
column (so an all-null column, or a job with no results yet, keeps its type). pyarrow is an optional
dependency (``genjob[parquet]``, in ``genjob[api]`` too); without it ``ParquetUnavailable`` says what
to install.
Must not know: the CLI, HTTP, torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, BinaryIO

from genjob.formats.result_fields import EXPORT_FIELDS

ROW_GROUP = 10_000


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
    schema = pa.schema([(field.name, getattr(pa, field.arrow_type)()) for field in EXPORT_FIELDS])
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
