"""Credentials kept out of what genjob says: one masking function for URLs, messages and log records.

``mask_url`` writes a URL with its password as ``***`` (``redis://user:***@host:6379/0``);
``mask_text`` does the same to every URL in a free text, and also hides, wherever they appear, the
passwords of the URLs this process was given (``GENJOB_*_URL`` in the environment, or any other URL
passed to ``remember_url``), so a driver's message quoting a password without its URL is masked too.
``install_log_masking`` makes every log record of the process masked when it is created (its message,
arguments and traceback), whichever handler writes it: the CLI, the API and the workers call it at start.
Must not know: the CLI, the API, the workers, the settings' validation.
"""

from __future__ import annotations

import logging
import os
import re
import traceback
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

MASK = "***"
# ``scheme://user:password@``: the password is what lies between the first ``:`` after the user and ``@``.
_URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)[^\s@/]+@")
MIN_SECRET_CHARS = 3  # shorter "passwords" would mask ordinary words; the URL pattern still hides them
_remembered: set[str] = set()


def url_password(url: str) -> str | None:
    """The password written in ``url``'s user info (``scheme://user:password@host``), or None."""
    rest = url.partition("://")[2] if "://" in url else url
    if rest.startswith("/") or "@" not in rest:
        return None
    userinfo = rest.rpartition("@")[0]
    if ":" not in userinfo:
        return None
    return userinfo.partition(":")[2] or None


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``: ``postgresql://genjob:***@db:5432/genjob``.

    Works on URLs that do not parse too (an invalid GENJOB_BROKER_URL is shown masked): everything
    between the user's ``:`` and the last ``@`` is hidden."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    password = url_password(url)
    if password is None:
        return url
    userinfo, _, host = rest.rpartition("@")
    user = userinfo.partition(":")[0]
    return f"{scheme}{sep}{user}:{MASK}@{host}"


def remember_url(url: str | None) -> None:
    """Hide ``url``'s password wherever ``mask_text`` sees it from now on (URLs not from the environment)."""
    password = url_password(url or "")
    if password:
        _remembered.update({password, unquote(password)})


def known_secrets() -> set[str]:
    """The passwords ``mask_text`` hides even outside a URL: those of ``GENJOB_*URL*`` variables and
    of the URLs given to ``remember_url``, as written and percent-decoded."""
    found = set(_remembered)
    for name, value in os.environ.items():
        if name.upper().startswith("GENJOB_") and "URL" in name.upper():
            password = url_password(value)
            if password:
                found.update({password, unquote(password)})
    return {secret for secret in found if len(secret) >= MIN_SECRET_CHARS}


def mask_text(text: str) -> str:
    """``text`` with every URL's password and every known password (``known_secrets``) as ``***``."""
    masked = _URL_CREDENTIALS.sub(lambda match: match.group("head") + MASK + "@", text)
    for secret in sorted(known_secrets(), key=len, reverse=True):
        masked = masked.replace(secret, MASK)
    return masked


def _masking_factory(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it when the record is written
            return record
        record.msg, record.args = mask_text(message), ()
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = mask_text("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
            record.exc_info = None  # the masked text stands for it: a formatter would print it unmasked
        if record.stack_info:
            record.stack_info = mask_text(record.stack_info)
        return record

    factory.genjob_masking = True  # type: ignore[attr-defined]
    return factory


def install_log_masking() -> None:
    """Mask every log record this process creates from now on (``mask_text``); safe to call again."""
    current = logging.getLogRecordFactory()
    if not getattr(current, "genjob_masking", False):
        logging.setLogRecordFactory(_masking_factory(current))


def install_excepthook() -> None:
    """An uncaught exception's traceback printed masked (``mask_text``), as Python would print it."""
    import sys

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        sys.stderr.write(mask_text("".join(traceback.format_exception(kind, value, tb))))

    sys.excepthook = hook
