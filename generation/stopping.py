"""Stop strings (OpenAI's ``stop``): end a row once its text holds one, and cut the text before it.

``stop_check`` is a ``Request.stop`` check, the one the worker gives each row with stop strings:
after each round the row's last tokens (a window longer than any stop string plus a round's tokens)
are decoded; once a stop string appears, the row keeps the tokens up to the one that completes it.
``cut_at_stop`` then drops the stop string and what follows from the text, as OpenAI does.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from genjob.generation.requests import StopCheck

STOP_WINDOW_TOKENS = 96  # tokens decoded to look for a stop string: a round's new tokens and then some


def stop_check(tokenizer: PreTrainedTokenizerBase, stops: list[str]) -> StopCheck:
    """The engine's stop check for stop strings: after each round, the row's last tokens (a window
    longer than any stop string plus a round's tokens) are decoded; once a stop string appears, the
    row keeps the tokens up to the one that completes it (``cut_at_stop`` trims the text)."""
    window = STOP_WINDOW_TOKENS + max(len(stop) for stop in stops)

    def found(tokens: list[int]) -> bool:
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        return any(stop in text for stop in stops)

    def check(tokens: list[int]) -> int | None:
        start = max(0, len(tokens) - window)
        if not found(tokens[start:]):
            return None
        end = start + 1
        while not found(tokens[start:end]):
            end += 1
        return end

    return check


def cut_at_stop(text: str, stops: list[str] | None) -> str:
    """The text before the first stop string (OpenAI leaves the stop string out)."""
    if not stops:
        return text
    cuts = [text.find(stop) for stop in stops if stop in text]
    return text[: min(cuts)] if cuts else text
