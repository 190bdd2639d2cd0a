"""Open a prompt file as a seekable binary stream, whatever the path names: a file, a pipe, or stdin.

The reader reads a file twice (check, then insert), so it needs a seekable stream. A regular file
is opened as it is (its size checked first, before a byte is read). A pipe — ``-`` (standard
input), ``/dev/stdin``, a shell's ``<(…)`` or a named pipe — is read once into a spool bounded by
``GENJOB_MAX_UPLOAD_BYTES`` (memory up to 1 MiB, then a temporary file); a named pipe that nothing
writes to is given up after ``PIPE_WAIT_S`` instead of hanging. Anything else (a directory, a
terminal, a device, a socket) is refused.
Must not know: the database, Celery, torch, HTTP.
"""

from __future__ import annotations

import fcntl
import os
import select
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import SpooledTemporaryFile
from typing import BinaryIO, cast

from genjob.formats.lines import InputFileError, InputLimits, LineError, file_too_large_message

STDIN = "-"
SPOOL_MEMORY_BYTES = 1 << 20
READ_BYTES = 1 << 20
PIPE_WAIT_S = 30.0  # how long a pipe may stay silent before its first byte

FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device (a terminal?)"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _refuse(source: str, message: str) -> InputFileError:
    return InputFileError(source, [LineError(None, message)])


@contextmanager
def open_prompt_source(path: Path, *, limits: InputLimits) -> Iterator[BinaryIO]:
    """A seekable binary stream of the prompts at ``path`` (``-``: standard input), or InputFileError."""
    source = str(path)
    if source == STDIN:
        if sys.stdin.isatty():
            raise _refuse("-", "standard input is a terminal: pipe the prompts in (… | genjob submit -)")
        with _spooled(sys.stdin.buffer.read, source, limits) as spool:
            yield spool
        return
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise _refuse(source, f"cannot read it: {exc.strerror}") from exc
    if stat.S_ISREG(mode):
        size = os.stat(path).st_size
        if size > limits.max_file_bytes:
            raise _refuse(source, file_too_large_message(size, limits.max_file_bytes))
        with path.open("rb") as stream:
            yield stream
        return
    if not stat.S_ISFIFO(mode):
        kind = next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")
        raise _refuse(source, f"{kind}: pass a regular file, a pipe, or - for standard input")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # never blocks, writer or not
    except OSError as exc:
        raise _refuse(source, f"cannot read it: {exc.strerror}") from exc
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)
        if not poller.poll(int(PIPE_WAIT_S * 1000)):  # a pipe nobody opened to write: never blocks
            raise _refuse(
                source,
                f"a named pipe that nothing wrote to within {PIPE_WAIT_S:g} s: start its writer first, "
                "or pass a regular file",
            )
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        with _spooled(lambda size: os.read(fd, size), source, limits) as spool:
            yield spool
    finally:
        os.close(fd)


@contextmanager
def _spooled(read: Callable[[int], bytes], source: str, limits: InputLimits) -> Iterator[BinaryIO]:
    """Everything ``read`` gives up to its end, in a spool bounded by the upload limit."""
    spool = cast(BinaryIO, SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES))  # noqa: SIM115 (closed below)
    try:
        size = 0
        while chunk := read(READ_BYTES):
            size += len(chunk)
            if size > limits.max_file_bytes:
                raise _refuse(source, file_too_large_message(None, limits.max_file_bytes))
            try:
                spool.write(chunk)  # past SPOOL_MEMORY_BYTES: into a file in the temporary directory
            except OSError as exc:
                raise _refuse(
                    source,
                    f"cannot spool it in {tempfile.gettempdir()}: {exc.strerror or exc} (TMPDIR sets where)",
                ) from exc
        spool.seek(0)
        yield spool
    finally:
        spool.close()
