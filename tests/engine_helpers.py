"""Shared helpers of the engine tests: the oracle (transformers' plain greedy ``generate``), a draft that
mostly agrees, costs that need no timing, requests."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from genjob.generation.costs import CostModel
from genjob.generation.requests import Request

REFERENCE_TOKENS = 40  # greedy with max_new_tokens=k is the first k tokens of this decode
DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"


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
            ids = torch.tensor([prompt])
            room = self.target.config.n_positions - len(prompt)
            with torch.inference_mode():
                out = self.target.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=min(REFERENCE_TOKENS, room),
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )
            self._memo[key] = out[0, len(prompt) :].tolist()
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
