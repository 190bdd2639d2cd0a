"""Stop sequences: end a row when its decoded text contains one of some strings (OpenAI's ``stop``).

``StopSequences`` is a ``Request.stop`` check: it decodes the row's new tokens, finds the earliest
stop string, and keeps the fewest tokens whose text reaches its end; ``cut_text`` then drops the
stop string and what follows from the text, as OpenAI does. Must not know: the database, Celery,
HTTP, the core.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """The index where the earliest stop string starts in ``text``, or None."""
    found = [index for index in (text.find(stop) for stop in stops if stop) if index >= 0]
    return min(found) if found else None


def cut_text(text: str, stops: Sequence[str]) -> str:
    """``text`` up to (without) the earliest stop string."""
    index = find_stop(text, stops)
    return text if index is None else text[:index]


class StopSequences:
    """Call with a row's new tokens: how many to keep once a stop string appears in their text, else None."""

    def __init__(self, tokenizer: Decoder, stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = [stop for stop in stops if stop]

    def _text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def __call__(self, tokens: list[int]) -> int | None:
        text = self._text(tokens)
        start = find_stop(text, self.stops)
        if start is None:
            return None
        end = start + min(len(stop) for stop in self.stops if text.startswith(stop, start))
        keep = len(tokens)
        while keep > 1 and len(self._text(tokens[: keep - 1])) >= end:
            keep -= 1  # the fewest tokens whose text still holds the whole stop string
        return keep
