"""Shared helpers of the engine tests (and bench/lossless.py): the oracle (transformers' plain greedy
``generate``) and where a row may differ from it, a draft that mostly agrees, costs that need no timing,
requests."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path

import torch

from genjob.generation.costs import CostModel
from genjob.generation.requests import Request

REFERENCE_TOKENS = 40  # greedy with max_new_tokens=k is the first k tokens of this decode
DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"


def greedy(
    model, ids: list[int], max_new_tokens: int, eos: Iterable[int] | None, pad_token_id: int = 0
) -> list[int]:
    """The oracle: transformers' own greedy ``generate`` of one prompt (batch 1, no assistant), its new
    tokens; it stops at any of ``eos`` (None: never)."""
    prompt = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None if eos is None else sorted(eos),
            pad_token_id=pad_token_id,
        )
    return out[0, len(ids) :].tolist()


def top2_gap(model, ids: list[int]) -> float:
    """How far apart the model's two best logits for the token after ``ids`` are."""
    with torch.inference_mode():
        top = model(torch.tensor([ids])).logits[0, -1].topk(2).values
    return float(top[0] - top[1])


def gap_where_they_differ(model, ids: list[int], got: list[int], expected: list[int]) -> float | None:
    """None where ``got`` is the oracle's ``expected``; else the top-2 gap of the oracle's logits at the
    first position they differ (float noise may flip a near tie, and only that)."""
    if got == expected:
        return None
    at = next(j for j, (a, b) in enumerate(zip(got, [*expected, -1], strict=False)) if a != b)
    return top2_gap(model, ids + expected[:at])


class Reference:
    """Plain greedy decodes of single prompts, each computed once, without EOS: with an EOS the
    greedy decode is the same sequence cut after its first EOS, and with max_new_tokens=k its
    first k tokens."""

    def __init__(self, target) -> None:
        self.target = target
        self._memo: dict[tuple[int, ...], list[int]] = {}

    def decode(self, prompt: list[int]) -> list[int]:
        key = tuple(prompt)
        if key not in self._memo:
            room = self.target.config.n_positions - len(prompt)
            self._memo[key] = greedy(self.target, prompt, min(REFERENCE_TOKENS, room), None)
        return self._memo[key]

    def __call__(self, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
        assert max_new_tokens <= REFERENCE_TOKENS
        tokens = self.decode(prompt)[:max_new_tokens]
        return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def perturbed(model, sigma: float, seed: int = 0):
    """A copy of ``model`` with Gaussian noise on every weight: a draft that mostly agrees."""
    twin = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in twin.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * sigma)
    return twin


def flat_costs(k_max: int = 8, draft_step: float = 0.05) -> CostModel:
    """Costs that make every k worth its drafts (no timing in tests): verify cost grows slowly with q."""
    queries = list(range(1, k_max + 2))
    return CostModel([1], queries, {1: [1.0 + 0.01 * q for q in queries]}, {1: draft_step}, context=64)


def request(key: int, ids: list[int], max_new_tokens: int, eos: int | None = None) -> Request:
    return Request(key=key, input_ids=ids, max_new_tokens=max_new_tokens, eos_ids=frozenset({eos} - {None}))


def syncs_in_one_round(engine) -> list[str]:
    """The host syncs CUDA reports during one round of ``engine`` (after a first step admitted its
    rows: the prefill's own sync is not counted); the round must finish no row."""
    import warnings

    engine.step()  # admission (the prefill's own sync) and a first round
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert engine.step() == []  # one round, nobody admitted, nobody finished
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [str(w.message) for w in caught if "synchroniz" in str(w.message)]
