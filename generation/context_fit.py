"""Whether a prompt and its max_new_tokens fit a model's context: the one rule, and its one message.

Submit checks it where the target's tokenizer can count (``genjob.api.prompt_tokenizer``), a worker
for every item it encodes (``genjob.worker.runners``), and the engine keeps it as a guard on the
requests it is handed. Plain ints in, no torch: whoever counts the tokens asks.
Must not know: torch, the database, Celery, HTTP, the core's tables or options.
"""

from __future__ import annotations


def context_problem(prompt_tokens: int, max_new_tokens: int, context: int | None) -> str | None:
    """Why ``prompt_tokens`` + ``max_new_tokens`` do not fit a ``context`` of that many positions, or
    None when they do (or the context is unknown: None)."""
    if context is None or prompt_tokens + max_new_tokens <= context:
        return None
    return (
        f"prompt of {prompt_tokens} tokens + max_new_tokens {max_new_tokens} exceeds the model's "
        f"context of {context} tokens"
    )
