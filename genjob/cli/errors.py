"""User errors as one line, never a traceback: the ``genjob`` group turns what users cause into messages.

Every message is masked (``genjob.redaction``: no password of any URL). A bad ``GENJOB_*`` value names
the variable and what it should be (a URL's password masked); a database that cannot be reached names
the URL (password masked) and the variable to check; a broker URL kombu has no transport for names the
variable; any error from the OS (a file that cannot be read or written, a full or
read-only disk, a refused connection) names the file, if any, and why; Ctrl-C stops with exit 130; a
closed stdout (``genjob results JOB | head -1``) stops quietly with exit 141, as ``yes | head`` does.
Every message reaches the terminal with its control characters escaped (``printable``), so an id
or a file name carrying escape sequences cannot drive the terminal. Bugs still raise: only these
classes of error are caught.
Must not know: the workers, the HTTP API.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any

import click

from genjob.cli.exits import ExitCode
from genjob.cli.lazy import LazyGroup
from genjob.redaction import mask_text, mask_url

if TYPE_CHECKING:
    from pydantic import ValidationError
    from sqlalchemy import exc as sa_exc

# C0 and C1 control characters and DEL; newlines and tabs stay (messages may span lines).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str, *, keep_newlines: bool = True) -> str:
    """``text`` with control characters written as escapes (``\\x1b``), safe to print on a terminal."""
    pattern = CONTROL if keep_newlines else re.compile(r"[\x00-\x1f\x7f-\x9f]")
    return pattern.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)


def settings_message(exc: ValidationError) -> str:
    """``GENJOB_CHUNK_SIZE='x': Input should be a valid integer`` for each bad variable."""
    problems = []
    for error in exc.errors():
        name = "GENJOB_" + str(error["loc"][0]).upper() if error["loc"] else "GENJOB_*"
        given = error.get("input")
        if isinstance(given, str):
            given = mask_url(given)  # an invalid URL still shows, its password masked
        shown = f"={given!r}" if isinstance(given, str | int | float) else ""
        problems.append(f"{name}{shown}: {str(error['msg']).removeprefix('Value error, ')}")
    return "invalid settings: " + "; ".join(problems)


def database_message(exc: sa_exc.DBAPIError | sa_exc.ArgumentError, url: str) -> str:
    """``database URL (password hidden): the driver's first line (check GENJOB_DATABASE_URL …)``."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    reason = lines[0] if lines else type(cause).__name__
    return f"database {mask_url(url)}: {reason} (check GENJOB_DATABASE_URL and that the server is up)"


def os_error_message(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def user_error_message(exc: Exception) -> str | None:
    """The one-line message of an error the user caused (see the module's doc), None for a bug.

    pydantic's and SQLAlchemy's errors are looked for only once their library is loaded (an error
    cannot come from a library nobody imported), so ``genjob --help`` loads neither."""
    if "pydantic" in sys.modules:
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            return settings_message(exc) if exc.title == "Settings" else None
    if "sqlalchemy" in sys.modules:
        from sqlalchemy import exc as sa_exc

        if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.ArgumentError):
            return database_message(exc, _database_url())
    if isinstance(exc, OSError):  # a missing file, no permission, a full or read-only disk, a refused link
        return os_error_message(exc)
    return None


class GenjobGroup(LazyGroup):
    """The ``genjob`` group: user errors become one-line messages (see the module's doc)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            done = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe is found here, not at the interpreter's exit
            return done
        except BrokenPipeError:
            _quiet_closed_pipe()
            ctx.exit(ExitCode.CLOSED_PIPE)
        except click.ClickException as exc:
            # escaped and masked in place, the same exception
            exc.message = printable(mask_text(exc.message))  # type: ignore[misc]
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(ExitCode.INTERRUPTED)
        except Exception as exc:
            message = user_error_message(exc)
            if message is None:
                raise
            raise click.ClickException(printable(mask_text(message))) from exc


def _quiet_closed_pipe() -> None:
    """The reader of stdout went away (``| head -1``): stop quietly; what is left unflushed goes to
    /dev/null, so the interpreter's exit does not complain about it either."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file behind stdout (a test's capture)
        pass


def _database_url() -> str:
    from pydantic import ValidationError

    from genjob.settings import get_settings

    try:
        return get_settings().database_url
    except ValidationError:
        return "GENJOB_DATABASE_URL"
