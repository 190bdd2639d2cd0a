"""Load models and tokenizers by hub id or local path, once per process, cached by name.

Never ``trust_remote_code``: only architectures built into transformers are loaded.
"""

from __future__ import annotations

import logging
from functools import lru_cache

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

log = logging.getLogger(__name__)
hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded, or a draft does not fit its target."""


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@lru_cache(maxsize=4)
def load_model(name_or_path: str, device: str = "cpu") -> PreTrainedModel:
    """A causal LM in eval mode, fp32 on CPU (bf16 would not be lossless against fp32 baselines)."""
    log.info("loading model %s on %s", name_or_path, device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=torch.float32, trust_remote_code=False
        )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load model {name_or_path!r}: {exc}") from exc
    return model.to(resolve_device(device)).eval()


@lru_cache(maxsize=4)
def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load tokenizer {name_or_path!r}: {exc}") from exc


def check_same_vocabulary(target: str, assistant: str) -> None:
    """Assisted generation needs the draft to share the target's tokenizer; refuse otherwise."""
    target_vocab = load_tokenizer(target).get_vocab()
    draft_vocab = load_tokenizer(assistant).get_vocab()
    if target_vocab != draft_vocab:
        only_target = len(target_vocab.keys() - draft_vocab.keys())
        only_draft = len(draft_vocab.keys() - target_vocab.keys())
        raise ModelLoadError(
            f"draft {assistant!r} does not share the tokenizer of target {target!r} "
            f"({len(draft_vocab)} vs {len(target_vocab)} tokens; {only_target} only in the target, "
            f"{only_draft} only in the draft)"
        )
