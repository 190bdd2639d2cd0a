"""Which models the batched forward decodes, read from a model's config alone (no torch, no weights).

genjob hands every model its own 4-D attention mask and explicit positions (``forward``). Attention
that needs more than a mask and positions cannot be decoded that way: ALiBi (Bloom, MPT, Falcon with
``alibi``) builds its bias from a 2-D padding mask it is not given. Such a model is refused before any
item is taken: by ``genjob submit`` for a local directory (``local_model_refusal``, from its
``config.json``), and by the worker when it loads the model (``forward.attention_layout`` adds what
only a loaded model shows: the kinds of its cache layers). The refusal is one line,
``cannot decode model 'NAME': REASON``.
Must not know: torch, transformers, the database, Celery, HTTP, the core.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ALIBI_MODEL_TYPES = frozenset({"bloom", "mpt"})


def decoding_refusal(config: dict[str, Any]) -> str | None:
    """Why a model with this config (``config.json`` as a dict) cannot be decoded, or None."""
    text = config.get("text_config") or config
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    if (
        model_type in ALIBI_MODEL_TYPES
        or text.get("alibi") is True
        or text.get("position_embedding_type") == "alibi"
        or (text.get("attn_config") or {}).get("alibi") is True
    ):
        return f"{model_type or 'its'} ALiBi attention is not supported (its bias needs a 2-D padding mask)"
    return None


def refusal_line(name: str, reason: str) -> str:
    """The one line a refused model's job fails with."""
    return f"cannot decode model {name!r}: {reason}"


def local_model_refusal(location: str) -> str | None:
    """The refusal line for a local model directory whose ``config.json`` says it cannot be decoded;
    None for a decodable one, a hub id or a GGUF file (the worker checks those when it loads them)."""
    config_file = Path(location) / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    reason = decoding_refusal(config) if isinstance(config, dict) else None
    return None if reason is None else refusal_line(location, reason)
