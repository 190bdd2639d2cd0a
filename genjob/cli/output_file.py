"""Where ``-o PATH`` writes, by what PATH is: never replacing a link, a FIFO or a device with a plain file.

- a regular file, or nothing yet: written aside in the same directory and renamed over it once complete
  (a reader never sees half a file), with the permissions the user's umask gives a new file;
- a symlink: the same at the file it points to (resolved), the link left as it is;
- a FIFO or a character device (``/dev/stdout``, ``>(gzip > x.gz)``, ``/dev/null``): streamed into it;
- a directory, a socket, anything else: refused.
An error from the OS (a full or read-only filesystem, no permission) is one line naming PATH and the
error's words, and nothing is left at PATH or beside it.
Must not know: the workers, the HTTP API, the formats written.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import click


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


def _open(handle: int, binary: bool) -> IO:
    return os.fdopen(handle, "wb") if binary else os.fdopen(handle, "w", encoding="utf-8", newline="")


def _failed(output: Path, exc: OSError) -> click.ClickException:
    return click.ClickException(f"cannot write {output}: {exc.strerror or exc}")


@contextmanager
def output_file(output: Path, *, binary: bool) -> Iterator[IO]:
    """A stream for ``output`` (see the module's docstring); OS errors become one-line ``ClickException``s."""
    try:
        mode = os.stat(output).st_mode  # follows a symlink to what it points to
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise _failed(output, exc) from exc
    if mode is not None and stat.S_ISDIR(mode):
        raise click.ClickException(f"cannot write {output}: it is a directory")
    if mode is not None and (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        with _streamed(output, binary) as stream:
            yield stream
        return
    if mode is not None and not stat.S_ISREG(mode):
        raise click.ClickException(f"cannot write {output}: not a regular file, a FIFO or a character device")
    with _renamed_into_place(output, binary) as stream:
        yield stream


@contextmanager
def _streamed(output: Path, binary: bool) -> Iterator[IO]:
    try:
        stream = _open(os.open(output, os.O_WRONLY), binary)
    except OSError as exc:
        raise _failed(output, exc) from exc
    try:
        with stream:
            yield stream
    except OSError as exc:
        raise _failed(output, exc) from exc


@contextmanager
def _renamed_into_place(output: Path, binary: bool) -> Iterator[IO]:
    target = Path(os.path.realpath(output)) if output.is_symlink() else output
    directory = target.parent
    if not directory.is_dir():
        raise click.ClickException(f"cannot write {output}: directory {str(directory)!r} does not exist")
    try:
        handle, temp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise _failed(output, exc) from exc
    try:
        os.fchmod(handle, 0o666 & ~_umask())
        with _open(handle, binary) as stream:
            yield stream
        os.replace(temp, target)
    except OSError as exc:
        Path(temp).unlink(missing_ok=True)
        raise _failed(output, exc) from exc
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
