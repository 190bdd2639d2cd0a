"""Speculative sampling keeps the target's distribution; seeded runs repeat exactly."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from model_factory import build_model, build_tokenizer

from genjob.generation.engine import DecodeOptions, Engine

SAMPLES = 400


@pytest.fixture(scope="module")
def peaked_pair():
    """Random untied models with scaled heads: peaked next-token distributions that disagree."""
    tokenizer = build_tokenizer()
    models = []
    for layers, width, seed in ((2, 64, 1), (1, 32, 2)):
        model = build_model(tokenizer, n_layer=layers, n_embd=width, seed=seed)
        with torch.no_grad():
            model.lm_head.weight.mul_(25.0)
        models.append(model)
    return models[0], models[1], tokenizer


def next_token_probs(model, ids: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]  # [V]
    return torch.softmax(logits / temperature, dim=-1)


def bucketed_tv(p: torch.Tensor, q: torch.Tensor, tokens: list[int]) -> float:
    """Total variation over the given tokens plus one bucket for all others."""
    index = torch.tensor(tokens)
    p_b = torch.cat([p[index], (1 - p[index].sum()).reshape(1)])
    q_b = torch.cat([q[index], (1 - q[index].sum()).reshape(1)])
    return 0.5 * float((p_b - q_b).abs().sum())


def test_first_token_frequencies_follow_the_target_not_the_draft(peaked_pair) -> None:
    target, draft, tokenizer = peaked_pair
    ids = tokenizer("def foo(x):")["input_ids"]
    temperature = 1.0
    p_target = next_token_probs(target, ids, temperature)
    p_draft = next_token_probs(draft, ids, temperature)
    buckets = sorted(set(p_target.topk(4).indices.tolist()) | set(p_draft.topk(4).indices.tolist()))
    assert bucketed_tv(p_target, p_draft, buckets) > 0.5, "the test needs a draft that disagrees"

    engine = Engine(target, assistant=draft, draft_tokens=1)
    counts: Counter[int] = Counter()
    for seed in range(SAMPLES):
        # Two new tokens: the first is decided by the speculative accept/reject of one draft token.
        decoded = engine.generate(ids, DecodeOptions(max_new_tokens=2, temperature=temperature, seed=seed))
        counts[decoded.token_ids[0]] += 1
    empirical = torch.zeros_like(p_target)
    for token, count in counts.items():
        empirical[token] = count / SAMPLES

    assert bucketed_tv(empirical, p_target, buckets) < 0.1
    assert bucketed_tv(empirical, p_draft, buckets) > 0.4


def test_seeded_sampling_repeats_exactly(peaked_pair) -> None:
    target, draft, tokenizer = peaked_pair
    engine = Engine(target, assistant=draft, draft_tokens=3)
    ids = tokenizer("import os")["input_ids"]
    options = DecodeOptions(max_new_tokens=12, temperature=0.8, top_p=0.9, seed=7)
    first = engine.generate(ids, options).token_ids
    assert engine.generate(ids, options).token_ids == first
    other = {tuple(engine.generate(ids, DecodeOptions(12, 0.8, 0.9, seed)).token_ids) for seed in range(5)}
    assert len(other) > 1
