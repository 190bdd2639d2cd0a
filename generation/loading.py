"""Load models and tokenizers by hub id, local path or GGUF file, once per process, cached by name.

A GGUF file is converted once into the model cache (``cache_dir``, see ``model_source``) and loaded
from there as a plain checkpoint. Never ``trust_remote_code``: only architectures built into
transformers are loaded. The dtype is the device's: float32 on CPU, bfloat16 on a GPU that has it
(else float16), unless asked; lossless means equal to plain decoding in the same dtype. On a CPU every
linear layer's weight is laid out for the matrix products a speculative round makes (``lay_out_for_cpu``);
on every device SDPA attention packs grouped-query heads instead of repeating K/V (``attention``).
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from genjob.generation.attention import use_packed_attention
from genjob.generation.forward import UnsupportedModel, attention_layout
from genjob.generation.model_kinds import refusal_line
from genjob.generation.model_source import ModelLoadError as ModelLoadError  # raised here, and re-exported
from genjob.generation.model_source import local_checkpoint

log = logging.getLogger(__name__)
hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: float32 on CPU, bfloat16 on a GPU that supports it, else float16."""
    if dtype != "auto":
        return DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


@lru_cache(maxsize=4)
def load_model(
    name_or_path: str, device: str = "cpu", dtype: str = "auto", *, cache_dir: str | None = None
) -> PreTrainedModel:
    """A causal LM in eval mode on ``device`` in ``dtype`` (see ``resolve_dtype``); a GGUF file is
    loaded from its checkpoint in ``cache_dir`` (converted first if need be). ``UnsupportedModel``
    (a ``ModelLoadError``: the job's fault) for a model the batched forward cannot decode."""
    target = resolve_device(device)
    checkpoint = local_checkpoint(name_or_path, cache_dir)
    log.info("loading model %s on %s", name_or_path, target)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            checkpoint, dtype=resolve_dtype(dtype, target), trust_remote_code=False
        )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load model {name_or_path!r}: {exc}") from exc
    loaded: Any = model  # transformers' to() and eval() are untyped
    ready = cast(PreTrainedModel, loaded.to(target).eval())
    use_packed_attention(ready)
    try:
        attention_layout(ready)  # found now: a model the batched forward cannot decode fails here
    except UnsupportedModel as exc:
        raise UnsupportedModel(refusal_line(name_or_path, str(exc))) from None
    if target.type == "cpu":
        lay_out_for_cpu(ready)
    return ready


@torch.no_grad()
def lay_out_for_cpu(model: PreTrainedModel) -> None:
    """Store each ``nn.Linear`` weight (out, in) as the transpose of a contiguous (in, out) tensor: the
    same values and the same ``F.linear``, but the CPU's GEMM then reads the weight without repacking
    it. A verification forward multiplies B·(k+1) rows at once, and on a CPU with the row-major layout
    float32 GEMM repacks the weight from 4 rows up: one token per row for 4 rows cost 1.6× one row, 11
    tokens 2.5× (smollm2's layers, one thread); with this layout 11 rows cost 1.5× one row and a plain
    step costs no more. A tied output layer gets its own copy (the input embedding keeps its rows,
    which a lookup reads): smollm2's costs 113 MB more memory."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.is_contiguous():
            laid_out = module.weight.detach().t().contiguous().t()
            module.weight = torch.nn.Parameter(laid_out, requires_grad=False)


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every id that ends a generation: the tokenizer's EOS and the generation config's (one or a list)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    config = getattr(model, "generation_config", None)
    configured = getattr(config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list | tuple):
        ids.update(int(x) for x in configured)
    return frozenset(ids)


@lru_cache(maxsize=4)
def load_tokenizer(name_or_path: str, *, cache_dir: str | None = None) -> PreTrainedTokenizerBase:
    """The model's tokenizer; a GGUF file's from its checkpoint in ``cache_dir`` (converted if need be)."""
    checkpoint = local_checkpoint(name_or_path, cache_dir)
    try:
        return AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load tokenizer {name_or_path!r}: {exc}") from exc


def check_same_vocabulary(target: str, assistant: str, *, cache_dir: str | None = None) -> None:
    """Assisted generation needs the draft to share the target's tokenizer; refuse otherwise."""
    target_vocab = load_tokenizer(target, cache_dir=cache_dir).get_vocab()
    draft_vocab = load_tokenizer(assistant, cache_dir=cache_dir).get_vocab()
    if target_vocab != draft_vocab:
        only_target = len(target_vocab.keys() - draft_vocab.keys())
        only_draft = len(draft_vocab.keys() - target_vocab.keys())
        raise ModelLoadError(
            f"draft {assistant!r} does not share the tokenizer of target {target!r} "
            f"({len(draft_vocab)} vs {len(target_vocab)} tokens; {only_target} only in the target, "
            f"{only_draft} only in the draft)"
        )
