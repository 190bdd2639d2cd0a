"""One batched forward of a causal LM over rows of a ``SlotCache``, each row at its own length.

Row r's q new tokens sit at positions lengths_r + 0..q-1 (explicit ``position_ids``) and see, through
a 4-D mask (rows, 1, q, width) built here, its own first lengths_r cached columns and, causally, the
new ones; transformers never guesses positions from padding. Rows of a prefill are right-padded:
a padded query sees only real columns and its output is never used.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

import inspect
from typing import Any, cast

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from genjob.generation.attention import PACKED_SDPA
from genjob.generation.slot_cache import SlotCache

_CACHE_KWARG: dict[type, str] = {}


def cache_kwarg(model: PreTrainedModel) -> str:
    """The forward's cache argument: ``cache`` in newer transformers (``past_key_values`` is
    deprecated there), ``past_key_values`` in older ones; accept either."""
    name = _CACHE_KWARG.get(type(model))
    if name is None:
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        _CACHE_KWARG[type(model)] = name
    return name


def same(values: list[int]) -> int | None:
    """The value if every one is equal (a host-side check, no device sync), else None."""
    return values[0] if values and min(values) == max(values) else None


def to_device(values: list[Any], device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values (a list, or a list of equal-length lists) as a tensor on ``device``, without waiting
    for work the device has queued. ``torch.tensor(values, device="cuda")`` copies from pageable memory
    and synchronises the stream, so mid-round (between draft steps, before the verification) each such
    copy would wait for every queued kernel: here the values go through pinned memory with a
    non-blocking copy instead, which the stream orders after that work (the caching host allocator
    keeps the pinned block until the copy is done). On the CPU it is ``torch.tensor``."""
    tensor = torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return tensor
    if device.type != "cuda":  # elsewhere a non-blocking copy from pageable memory is not safe to assume
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def max_positions(model: PreTrainedModel) -> int | None:
    """The model's context length (learned position table size), if it declares one."""
    config = model.config
    value = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    return int(value) if value else None


def cache_shapes(model: PreTrainedModel) -> list[tuple[int, int]]:
    """(heads, head_dim) of each layer's K/V, from a one-token forward into a fresh DynamicCache."""
    cache = DynamicCache(config=model.config)
    ids = torch.zeros(1, 1, dtype=torch.long, device=model.device)
    with torch.inference_mode():
        model(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache})
    if not all(type(layer) is DynamicLayer for layer in cache.layers):
        raise NotImplementedError("batched decoding supports full-attention (DynamicLayer) caches only")
    shapes = []
    for layer in cache.layers:
        keys = cast(torch.Tensor, layer.keys)  # type: ignore[union-attr]
        shapes.append((int(keys.shape[1]), int(keys.shape[3])))
    return shapes


def _attention_mask(model: PreTrainedModel, allowed: torch.Tensor) -> torch.Tensor:
    """The boolean (rows, 1, q, width) mask as this model's attention wants it."""
    implementation = model.config._attn_implementation
    if implementation in ("sdpa", PACKED_SDPA):
        return allowed
    if implementation == "eager":  # additive
        zero = torch.zeros((), dtype=model.dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.finfo(model.dtype).min)
    raise NotImplementedError(f"batched decoding supports eager and sdpa attention, not {implementation!r}")


def forward_rows(
    model: PreTrainedModel,
    cache: SlotCache,
    rows: tuple[int, int],
    lengths: list[int],
    input_ids: torch.Tensor,
    *,
    last: torch.Tensor | None = None,
) -> torch.Tensor:
    """Forward (rows, q) new tokens of slots [start, stop) at positions lengths_r + 0..q-1.

    Returns logits (rows, q, V), or, with ``last`` (rows,) the index of each row's last real token,
    only those logits (rows, V) (a prefill: the head runs on one position per row). ``lengths`` come from
    the host and reach the device without a stream sync (``to_device``), so nothing here waits for the
    device; when they are all equal the K/V write is a slice.
    Tokens past a row's end (drafts it can never accept, padding) may index past a learned position
    table; they are never kept and only later padding sees them, so their positions are clamped."""
    n, q = input_ids.shape
    steps = torch.arange(q, device=input_ids.device)
    positions = to_device(lengths, input_ids.device)[:, None] + steps  # (rows, q)
    width = max(lengths) + q
    cursor = cache.cursor
    cursor.start, cursor.stop = rows
    cursor.columns, cursor.width = positions, width
    cursor.first = same(lengths)
    allowed = torch.arange(width, device=steps.device) <= positions[:, :, None]  # (rows, q, width)
    limit = max_positions(model)
    if limit is not None:
        positions = positions.clamp(max=limit - 1)
    arguments: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": _attention_mask(model, allowed[:, None]),
        "position_ids": positions,
        "use_cache": True,
        cache_kwarg(model): cache,
    }
    if last is None:
        return model(**arguments).logits  # type: ignore[no-any-return]
    base = getattr(model, model.base_model_prefix)
    hidden = base(**arguments).last_hidden_state  # (rows, q, d)
    picked = hidden[torch.arange(n, device=hidden.device), last]  # (rows, d)
    head = model.get_output_embeddings()  # type: ignore[no-untyped-call]
    assert head is not None, "a causal LM has an output head"
    return head(picked)  # type: ignore[no-any-return]
