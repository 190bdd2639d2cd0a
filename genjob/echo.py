"""How a value a client sent is echoed back in an error message: quoted, and cut to a readable length
(an id of 60,000 characters comes back as its first 64 and a count, not whole).
Must not know: anything else of genjob; it is plain text.
"""

from __future__ import annotations

ECHO_CHARS = 64


def echoed(value: str) -> str:
    """``value`` quoted (``repr``), its first ``ECHO_CHARS`` characters when longer, with how many more."""
    if len(value) <= ECHO_CHARS:
        return repr(value)
    return f"{value[:ECHO_CHARS]!r}… ({len(value) - ECHO_CHARS} more characters)"
