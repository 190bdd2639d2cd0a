"""Whether an output ends in a loop: the quality signal a row carries beside its text.

A small model decoding greedily can fall into a cycle, the same few tokens again and again to
``max_new_tokens`` (speculation then accepts everything: the target copies its own output, the
extreme of acceptance). ``ends_in_a_loop`` says so from the token ids alone: the output's last
``LOOP_TOKENS`` tokens or more repeat with a period of at most ``MAX_PERIOD`` tokens, at least
``MIN_REPEATS`` times. A flag for the user to find degenerate rows, never an error.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

from collections.abc import Sequence

LOOP_TOKENS = 24  # the shortest tail that counts as a loop (24 of one token, 8 × 3, 12 × 2 …)
MAX_PERIOD = 32  # the longest cycle looked for, in tokens
MIN_REPEATS = 3  # a cycle seen fewer times in a row is no loop (a list of two similar lines is not)


def ends_in_a_loop(tokens: Sequence[int]) -> bool:
    """True if the tail of ``tokens`` is one short cycle repeated (see the module's doc)."""
    for period in range(1, MAX_PERIOD + 1):
        span = max(LOOP_TOKENS, MIN_REPEATS * period)
        if len(tokens) < span:
            break
        tail = tokens[-span:]
        if all(tail[i] == tail[i - period] for i in range(period, span)):
            return True
    return False
