"""Attention for rounds of several tokens per row: SDPA with grouped-query heads packed, never repeated.

transformers' SDPA path for a model with grouped-query attention (fewer K/V heads than query heads, as
Llama-family models have) packs the query heads of each K/V head together when one token per row is
decoded, but for q > 1 tokens with a mask (every verification round, since rows have their own
lengths) it repeats K and V to the query heads: a copy of every row's whole cache in every layer, each
round. On a CPU that copy, not the attention, made a verification dear at real contexts (smollm2, 10
rows at 500 cached tokens, two threads: q = 2 cost 1.46× a plain step, q = 5 1.95×; 1.05× and 1.29×
at 64 cached tokens, where the cost grid is measured). ``packed_sdpa`` lays the q tokens of each
group's query heads along the query axis, (B, heads, q, d) → (B, kv_heads, groups·q, d), with the
row's mask tiled to match, and runs SDPA on the K/V heads as they are: the same dot products, no copy.
Whatever else (no mask, one query token, no grouping) goes to transformers' own function.

``use_packed_attention`` switches a loaded model to it (registered with transformers under
``PACKED_SDPA``, with SDPA's mask function), only where the model uses SDPA.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

PACKED_SDPA = "genjob_packed_sdpa"


def packed_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, heads, q, d)
    key: torch.Tensor,  # (B, kv_heads, width, d)
    value: torch.Tensor,  # (B, kv_heads, width, d)
    attention_mask: torch.Tensor | None,  # (B, 1, q, width), boolean or additive
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention output (B, q, heads, d), as transformers' ``sdpa_attention_forward`` returns it."""
    batch, heads, q, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    if attention_mask is None or groups == 1 or q == 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    packed = query.reshape(batch, kv_heads, groups * q, dim)  # query head h·groups + g, token t → g·q + t
    mask = attention_mask.repeat(1, 1, groups, 1)  # (B, 1, groups·q, width): row g·q + t is token t's
    output = torch.nn.functional.scaled_dot_product_attention(
        packed, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )  # (B, kv_heads, groups·q, d)
    return output.reshape(batch, heads, q, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa)
AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)


def use_packed_attention(model: PreTrainedModel) -> None:
    """Switch ``model`` (and its sub-configs) from SDPA to ``packed_sdpa``; other attentions stay."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(PACKED_SDPA)
