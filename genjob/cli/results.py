"""``genjob results``: a job's results in input order, to stdout or a file, in JSONL, CSV, OpenAI or Parquet.

Bytes are exact by default; ``--csv-safe`` defuses formula-leading cells for spreadsheets. On a
terminal, control characters are shown escaped (an output or id carrying escape sequences cannot
drive it); to a pipe or a file they pass unchanged. ``-o`` writes a file beside it and renames it
into place once complete, and streams into a FIFO or a device (``genjob.cli.output_file``); ``-o -``
is stdout.
Must not know: the workers, the HTTP API.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, BinaryIO, cast

import click

from genjob.cli.context import job_reference, load_job, settings_and_schema
from genjob.cli.errors import printable
from genjob.cli.output import counted
from genjob.cli.output_file import output_file
from genjob.constants import ItemStatus
from genjob.db import session_scope
from genjob.formats.export import ResultFormat, export_job, iter_result_records
from genjob.formats.parquet import ParquetUnavailable, write_parquet


def _on_terminal() -> bool:
    return sys.stdout.isatty()


@click.command()
@job_reference
@click.option(
    "--format", "fmt", type=click.Choice([f.value for f in ResultFormat]), default="jsonl", show_default=True
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    help="Write here instead of stdout (a file, a FIFO, a device; - is stdout).",
)
@click.option(
    "--status",
    type=click.Choice(
        [s.value for s in (ItemStatus.DONE, ItemStatus.FAILED, ItemStatus.PENDING, ItemStatus.CANCELLED)]
    ),
    help="Only the items in this state (failed: the ones to look at).",
)
@click.option("--csv-safe", is_flag=True, help="Prefix ' to CSV cells starting with = + - @ (spreadsheets).")
def results(job_id: str, fmt: str, output: Path | None, status: str | None, csv_safe: bool) -> None:
    """Export a job's results in input order (one record per item, with its custom id).

    --format openai writes OpenAI batch output lines ({"custom_id", "response":
    {"body": ...}, "error"}); parquet a Parquet file (needs -o or a pipe). With
    -o a file appears only once complete (written aside, then renamed; a
    symlink's target is written, the link kept); a FIFO or a device is
    written straight into.
    """
    settings = settings_and_schema()
    job = load_job(settings, job_id)
    if output == Path("-"):
        output = None
    written = 0
    with session_scope(settings.database_url) as session:
        if fmt == ResultFormat.PARQUET:
            records = iter_result_records(session, job_id=job.id, status=status)
            if output is None:
                if _on_terminal():
                    raise click.ClickException("Parquet is binary: write it to a file (-o FILE) or a pipe")
                written = _parquet(records, sys.stdout.buffer)
                return
            with output_file(output, binary=True) as stream:
                written = _parquet(records, stream)
        else:
            chunks = export_job(
                session, job=job, fmt=ResultFormat(fmt), status=status, csv_safe=csv_safe, model_paths=True
            )
            if output is None:
                terminal = _on_terminal()
                stdout = sys.stdout  # not click.echo: it drops escape sequences from what goes to a pipe
                for chunk in chunks:
                    stdout.write(printable(chunk) if terminal else chunk)
                stdout.flush()
                return
            with output_file(output, binary=False) as stream:
                for chunk in chunks:
                    stream.write(chunk)
                    written += 1
    if fmt == ResultFormat.CSV and written:
        written -= 1  # the header
    click.echo(f"wrote {counted(written, 'record')} to {output}", err=True)


def _parquet(records: Iterator[dict], stream: IO) -> int:
    try:
        return write_parquet(records, cast(BinaryIO, stream))
    except ParquetUnavailable as exc:
        raise click.ClickException(str(exc)) from exc


COMMANDS = (results,)
