"""Costs measured on this device: a cached decode step, the draft/target cost ratio, a batch size probe.

Token ids and tensors only: must not know the database, Celery or HTTP.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch
from transformers import DynamicCache, PreTrainedModel

from genjob.generation.batched import forward_step
from genjob.generation.engine import cache_kwarg
from genjob.generation.slot_cache import SlotCache

log = logging.getLogger(__name__)


def forward_seconds(model: PreTrainedModel, prompt_ids: list[int], *, repeats: int = 12) -> float:
    """Median time of one cached 1-token forward after a prefill of ``prompt_ids`` (a decode step)."""
    device = model.device
    with torch.inference_mode():
        prompt = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # [1, T]
        cache = DynamicCache()
        cache_arg = {cache_kwarg(model): cache}
        logits = model(prompt, use_cache=True, **cache_arg).logits  # [1, T, V]
        token = logits[:, -1:].argmax(-1)  # [1, 1]
        length = len(prompt_ids)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            model(
                token,
                use_cache=True,
                **cache_arg,
                position_ids=torch.tensor([[length]], device=device),
            )
            times.append(time.perf_counter() - started)
            cache.crop(-1)  # drop the step again: the context length stays fixed across repeats
    return statistics.median(times)


def cost_ratio(target: PreTrainedModel, draft: PreTrainedModel, prompt_ids: list[int]) -> float:
    """c = draft forward time / target forward time, each a cached 1-token step (Leviathan et al.)."""
    forward_seconds(target, prompt_ids, repeats=2)  # warm both up first
    forward_seconds(draft, prompt_ids, repeats=2)
    return forward_seconds(draft, prompt_ids) / forward_seconds(target, prompt_ids)


def probe_batch_size(
    target: PreTrainedModel, *, draft_tokens: int, context: int = 32, largest: int = 32
) -> int:
    """A batch size for this device: double B while a verify pass of B·(γ+1) tokens still gets
    ≥ 1.25× more tokens per second (time(2B) < 1.6 · time(B)); a few forwards, fastest of three."""
    q = draft_tokens + 1
    device = target.device

    @torch.inference_mode()
    def seconds(b: int) -> float:
        template = DynamicCache(config=target.config)
        ids = torch.zeros(1, context, dtype=torch.long, device=device)
        target(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_kwarg(target): template})
        cache = SlotCache(template, b, context + q)
        lengths = torch.full((b,), context, dtype=torch.long, device=device)
        tokens = torch.zeros(b, q, dtype=torch.long, device=device)
        best = float("inf")
        for _ in range(3):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            forward_step(target, cache, lengths, tokens)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - started)
        return best

    b, previous = 1, seconds(1)
    while b < largest:
        current = seconds(2 * b)
        if current > 1.6 * previous:
            break
        b, previous = 2 * b, current
    log.info("probed batch size %d for %s on %s", b, target.config.model_type, device)
    return b
