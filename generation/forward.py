"""One batched forward of a causal LM over rows of a ``SlotCache``, each row at its own length.

Row r's q new tokens sit at positions lengths_r + 0..q-1 (explicit ``position_ids``) and see, through
a 4-D mask (rows, 1, q, width) built here, its own first lengths_r cached columns and, causally, the
new ones; transformers never guesses positions from padding. Rows of a prefill are right-padded:
a padded query sees only real columns and its output is never used. A sliding-window layer's mask
keeps only the last w columns of each token (Mistral, Phi-3 one window; Gemma 2/3 a mask per layer
type); every column stays in the cache. Logits always come from the model's own ``forward``, so its
head code (Cohere's and Granite's logit scaling, Gemma's final softcapping) applies in every path.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from genjob.generation.attention import PACKED_SDPA
from genjob.generation.model_kinds import decoding_refusal
from genjob.generation.model_source import ModelLoadError
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


class UnsupportedModel(ModelLoadError):
    """A model the batched forward cannot decode exactly (its attention or cache is of a kind it does
    not handle); the job fails with this one line, the worker does not."""


@dataclass(frozen=True)
class AttentionLayout:
    """What the batched forward needs of a model's attention: (heads, head_dim) of each layer's K/V,
    and each layer's sliding window (None: full attention). ``keyed``: layers differ, so the model is
    handed one mask per layer type (``{"full_attention": …, "sliding_attention": …}``), as its own
    forward builds them; else one mask serves every layer."""

    shapes: list[tuple[int, int]]
    windows: dict[str, int | None]  # layer type -> window
    keyed: bool


_LAYOUTS: weakref.WeakKeyDictionary[PreTrainedModel, AttentionLayout] = weakref.WeakKeyDictionary()


def attention_layout(model: PreTrainedModel) -> AttentionLayout:
    """The model's ``AttentionLayout``, from a one-token forward into transformers' own cache for its
    config (which holds a sliding layer as ``DynamicSlidingWindowLayer``), found once per model.
    ``UnsupportedModel`` for what its config refuses (``model_kinds``), an attention implementation it
    cannot hand a mask, or a cache layer of any other kind (chunked, linear or state-space layers)."""
    layout = _LAYOUTS.get(model)
    if layout is not None:
        return layout
    reason = decoding_refusal(model.config.to_dict())
    if reason is not None:
        raise UnsupportedModel(reason)
    _attention_mask(model, torch.ones(1, 1, 1, 1, dtype=torch.bool))  # an attention it cannot mask: now
    cache = DynamicCache(config=model.config)
    ids = torch.zeros(1, 1, dtype=torch.long, device=model.device)
    with torch.inference_mode():
        model(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache})
    shapes: list[tuple[int, int]] = []
    windows: list[int | None] = []
    for layer in cache.layers:
        kind = type(layer)
        if kind is DynamicSlidingWindowLayer:
            windows.append(int(cast(Any, layer).sliding_window))
        elif kind is DynamicLayer:
            windows.append(None)
        else:
            raise UnsupportedModel(
                f"its {kind.__name__} cache layers are not supported (full and sliding-window attention are)"
            )
        keys = cast(torch.Tensor, layer.keys)  # type: ignore[union-attr]
        shapes.append((int(keys.shape[1]), int(keys.shape[3])))
    layout = AttentionLayout(shapes, *_windows_by_type(model, windows))
    _LAYOUTS[model] = layout
    return layout


def _windows_by_type(model: PreTrainedModel, windows: list[int | None]) -> tuple[dict[str, int | None], bool]:
    """Each layer type's window, and whether the layers differ (then the model needs a mask per type)."""
    if len(set(windows)) == 1:
        return {"all": windows[0]}, False
    types = getattr(model.config.get_text_config(), "layer_types", None)
    if not types or len(types) != len(windows):
        raise UnsupportedModel("its layers mix sliding-window and full attention without layer_types")
    by_type: dict[str, int | None] = {}
    for layer_type, window in zip(types, windows, strict=True):
        if by_type.setdefault(layer_type, window) != window:
            raise UnsupportedModel(f"its {layer_type} layers have different sliding windows")
    return by_type, True


def cache_shapes(model: PreTrainedModel) -> list[tuple[int, int]]:
    """(heads, head_dim) of each layer's K/V (see ``attention_layout``)."""
    return attention_layout(model).shapes


def _attention_mask(model: PreTrainedModel, allowed: torch.Tensor) -> torch.Tensor:
    """The boolean (rows, 1, q, width) mask as this model's attention wants it."""
    implementation = model.config._attn_implementation
    if implementation in ("sdpa", PACKED_SDPA):
        return allowed
    if implementation == "eager":  # additive
        zero = torch.zeros((), dtype=model.dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.finfo(model.dtype).min)
    raise UnsupportedModel(f"batched decoding supports eager and sdpa attention, not {implementation!r}")


def _masks(
    model: PreTrainedModel, positions: torch.Tensor, width: int
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The mask(s) of a forward whose (rows, q) new tokens sit at ``positions``: a token sees the
    columns at or before its position and, in a sliding-window layer of window w, only the last w of
    them (column > position - w, transformers' ``sliding_window_overlay``)."""
    layout = attention_layout(model)
    columns = torch.arange(width, device=positions.device)
    causal = columns <= positions[:, :, None]  # (rows, q, width)
    masks: dict[str, torch.Tensor] = {}
    built: dict[int | None, torch.Tensor] = {}
    for layer_type, window in layout.windows.items():
        if window not in built:
            allowed = causal if window is None else causal & (columns > positions[:, :, None] - window)
            built[window] = _attention_mask(model, allowed[:, None])
        masks[layer_type] = built[window]
    return masks if layout.keyed else next(iter(masks.values()))


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
    only those logits (rows, V) (a prefill: a hook on the base model keeps one position per row, and
    the model's own head code runs on those). ``lengths`` come from
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
    mask = _masks(model, positions, width)
    limit = max_positions(model)
    if limit is not None:
        positions = positions.clamp(max=limit - 1)
    arguments: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": positions,
        "use_cache": True,
        cache_kwarg(model): cache,
    }
    if last is None:
        return model(**arguments).logits  # type: ignore[no-any-return]
    picked = torch.arange(n, device=input_ids.device), last
    cut: list[bool] = []

    def keep_last(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
        """The base model's hidden states cut to each row's last real token, (rows, 1, d): the model's
        own head code then runs on those alone (its scaling and softcapping included)."""
        cut.append(True)
        if isinstance(output, tuple):
            return (output[0][picked][:, None], *output[1:])
        output.last_hidden_state = output.last_hidden_state[picked][:, None]
        return output

    hook = getattr(model, model.base_model_prefix).register_forward_hook(keep_last, with_kwargs=True)
    try:
        logits = model(**arguments).logits  # (rows, 1, V), or (rows, q, V) where the hook did not run
    finally:
        hook.remove()
    # A model whose head calls past its base model (OPT calls its decoder) gave every position's logits.
    return logits[:, 0] if cut else logits[picked]  # type: ignore[no-any-return]
