"""Tiny random models of the families genjob decodes, built from transformers' config classes (nothing
downloaded, no weights shipped): shaped as released (grouped and multi-query heads, MoE, partial rotary,
qk-norm, tied and untied heads, sliding windows, logit scaling and softcapping), sharing one vocabulary
of ``VOCAB`` ids, with sliding windows of ``WINDOW`` tokens so short rows run past them."""

from __future__ import annotations

from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedModel

from genjob.generation.attention import use_packed_attention

VOCAB = 128
WINDOW = 8

COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
HYBRID = ["sliding_attention", "full_attention"]  # Gemma 2/3 alternate local and global layers

# family -> (config class name, what differs from COMMON)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"tie_word_embeddings": True}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 8}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {"head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    ),
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "mistral_window": ("MistralConfig", {"sliding_window": WINDOW}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}),
    "gemma": ("GemmaConfig", {"head_dim": 8, "num_key_value_heads": 1}),
    "gemma2": (
        "Gemma2Config",
        {
            "head_dim": 8,
            "sliding_window": WINDOW,
            "query_pre_attn_scalar": 8,
            "layer_types": HYBRID,
            "final_logit_softcapping": 5.0,
            "attn_logit_softcapping": None,
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        {"head_dim": 8, "sliding_window": WINDOW, "query_pre_attn_scalar": 8, "layer_types": HYBRID},
    ),
    "phi3": ("Phi3Config", {"sliding_window": WINDOW, "num_key_value_heads": 4}),
    "gpt2": ("GPT2Config", {}),
    "gpt_neox": ("GPTNeoXConfig", {"rotary_pct": 0.25, "num_key_value_heads": 4}),
    "opt": ("OPTConfig", {"ffn_dim": 64, "word_embed_proj_dim": 32}),
    "falcon": ("FalconConfig", {"new_decoder_architecture": True, "num_kv_heads": 2, "alibi": False}),
    "stablelm": ("StableLmConfig", {"partial_rotary_factor": 0.25}),
    "olmo2": ("Olmo2Config", {}),
    "cohere": ("CohereConfig", {"logit_scale": 0.0625, "use_qk_norm": False}),
    "granite": ("GraniteConfig", {"logits_scaling": 8.0}),
    "gptj": ("GPTJConfig", {"rotary_dim": 4}),
    "smollm3": ("SmolLM3Config", {}),
}
# Families with ALiBi attention: refused at load with one line (``generation.model_kinds``).
ALIBI_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "bloom": ("BloomConfig", {}),
    "falcon_alibi": ("FalconConfig", {"alibi": True, "new_decoder_architecture": False}),
}


def family_config(family: str) -> Any:
    name, extra = {**FAMILIES, **ALIBI_FAMILIES}[family]
    return getattr(transformers, name)(**{**COMMON, **extra})


def family_model(family: str, *, seed: int = 0) -> PreTrainedModel:
    """A random model of ``family`` in eval mode, float32 on the CPU, with the attention transformers
    picks for it (SDPA where the family has it, else eager: Gemma 2, Bloom), as ``from_pretrained``
    does in the worker; then laid out as the worker lays it (``use_packed_attention``)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(family)).eval()
    use_packed_attention(model)
    return model  # type: ignore[no-any-return]
