"""How a loaded model is laid out for verification rounds: grouped-query heads packed in SDPA instead of
K/V repeated (``generation.attention``), and CPU weights stored for the GEMM (``lay_out_for_cpu``).
Both must change nothing but the time: the same logits, the same greedy tokens."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from genjob.generation.attention import PACKED_SDPA, use_packed_attention
from genjob.generation.forward import cache_shapes, forward_rows
from genjob.generation.loading import lay_out_for_cpu
from genjob.generation.slot_cache import SlotCache


def tiny_llama(*, kv_heads: int = 2) -> LlamaForCausalLM:
    """A random Llama with grouped-query attention (4 query heads over ``kv_heads`` K/V heads), tied
    embeddings like smollm2's."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def verification_logits(model, lengths: list[int], q: int) -> torch.Tensor:
    """Prefill rows of their own lengths, then one forward of q tokens per row (a verification round)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (len(lengths), max(lengths) + q), generator=generator)
    cache = SlotCache(cache_shapes(model), dtype=model.dtype, device=model.device)
    cache.reserve(len(lengths), max(lengths) + q)
    with torch.inference_mode():
        forward_rows(model, cache, (0, len(lengths)), [0] * len(lengths), ids[:, : max(lengths)])
        news = torch.stack([ids[r, n : n + q] for r, n in enumerate(lengths)])
        return forward_rows(model, cache, (0, len(lengths)), lengths, news)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_packed_attention_gives_transformers_sdpa_logits(kv_heads: int) -> None:
    model = tiny_llama(kv_heads=kv_heads)
    packed = copy.deepcopy(model)
    use_packed_attention(packed)
    assert packed.config._attn_implementation == PACKED_SDPA
    for q in (1, 2, 5):
        expected = verification_logits(model, [7, 12, 3], q)
        torch.testing.assert_close(verification_logits(packed, [7, 12, 3], q), expected)


def test_packed_attention_leaves_generate_unchanged() -> None:
    """transformers' own generate (no 4-D mask: causal prefill, then one token) on the packed model."""
    model = tiny_llama()
    packed = copy.deepcopy(model)
    use_packed_attention(packed)
    ids = torch.tensor([[5, 9, 11, 3, 7, 2]])
    with torch.inference_mode():
        outputs = [
            m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
            for m in (model, packed)
        ]
    assert torch.equal(outputs[0], outputs[1])


def test_cpu_layout_keeps_the_values_and_unties_the_head() -> None:
    model = tiny_llama()
    laid_out = copy.deepcopy(model)
    lay_out_for_cpu(laid_out)
    head, embeddings = laid_out.get_output_embeddings(), laid_out.get_input_embeddings()
    assert not head.weight.is_contiguous() and head.weight.t().is_contiguous()
    assert embeddings.weight.is_contiguous()  # a lookup reads rows
    assert head.weight.data_ptr() != embeddings.weight.data_ptr()
    torch.testing.assert_close(head.weight, embeddings.weight)
    for q in (1, 4, 11):
        torch.testing.assert_close(
            verification_logits(laid_out, [9, 4], q), verification_logits(model, [9, 4], q)
        )
