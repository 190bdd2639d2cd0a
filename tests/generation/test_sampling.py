"""Speculative sampling keeps the target's distribution exactly; seeded rows repeat at any batch size.

The acceptance rule is checked exactly on toy distributions (tens of thousands of rows in one call of
``verify_drafts``), then end to end on a tiny target/draft pair that disagree: the second token of
thousands of seeded rows follows the target's own distribution, not the draft's (chi-square).
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import Engine
from genjob.generation.requests import Request
from genjob.generation.sampling import RowSampling, keyed_uniforms, verify_drafts
from tests.support.engine import flat_costs, request
from tests.support.models import build_model, build_tokenizer

CHI2_999 = {4: 18.47, 6: 22.46, 8: 26.12}  # chi-square 99.9 % quantiles by degrees of freedom


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_keyed_uniforms_depend_on_the_key_only() -> None:
    seeds = torch.tensor([5, 5, 2**40 + 5, 7])
    positions = torch.tensor([[0, 1], [0, 1], [0, 1], [0, 1]])
    u = keyed_uniforms(seeds, positions, 2)
    assert torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2]) and not torch.equal(u[0], u[3])
    assert torch.equal(keyed_uniforms(seeds[:1], positions[:1], 2), u[:1])  # no dependence on batch-mates
    many = keyed_uniforms(torch.arange(20000), torch.zeros(20000, 1, dtype=torch.long), 1)[:, 0]
    assert float(many.min()) > 0 and float(many.max()) < 1
    assert abs(float(many.mean()) - 0.5) < 0.01


def drafts_from(q: torch.Tensor, seeds: torch.Tensor, k: int) -> torch.Tensor:
    """(n, k) drafts sampled from q for each seeded row, with the rows' own keyed draws."""
    u = keyed_uniforms(seeds, torch.arange(k)[None].expand(len(seeds), k) + 10_000, 1)
    return torch.searchsorted(q.double().cumsum(0), u * q.sum()).clamp(max=len(q) - 1)


@pytest.mark.parametrize("k", [1, 3])
def test_the_acceptance_rule_emits_the_targets_distribution(k: int) -> None:
    """p and q fixed per position (the toy target ignores its prefix): the first emitted token and the
    first two must follow p and p × p, whatever q proposed."""
    n, v = 40000, 5
    p = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    q = torch.tensor([0.05, 0.1, 0.15, 0.3, 0.4])  # a draft that prefers the target's unlikely tokens
    seeds = torch.arange(n)
    sampling = RowSampling(temperature=torch.ones(n), top_p=torch.ones(n), seeds=seeds)
    drafts = drafts_from(q, seeds, k)
    logits = p.log()[None, None].expand(n, k + 1, v)
    verdict = verify_drafts(
        logits,
        drafts,
        q[None, None].expand(n, k, v),
        torch.full((n,), k),
        sampling,
        torch.zeros(n, dtype=torch.long),
    )
    tokens = torch.cat([drafts, verdict.next_tokens[:, None]], 1)
    first = torch.where(verdict.accepted > 0, drafts[:, 0], verdict.next_tokens)
    counts = torch.bincount(first, minlength=v).double()
    assert chi_square(counts, p.double()) < CHI2_999[4]
    two = verdict.accepted >= 1  # rows that emitted at least two tokens this round
    second = torch.where(verdict.accepted[two] > 1, tokens[two, 1], verdict.next_tokens[two])
    pairs = torch.bincount(first[two] * v + second, minlength=v * v).double()
    marginal = torch.bincount(second, minlength=v).double()
    assert chi_square(marginal, p.double()) < CHI2_999[4]
    assert pairs.sum() > 1000


def test_rows_of_different_proposers_in_one_call_each_emit_the_targets_distribution() -> None:
    """Mode auto's batches: in one call, rows whose drafts were sampled from q, rows with a fixed guess
    (prompt lookup, the suffix cache: a one-hot q) and rows drafting nothing (limit 0). Each kind's
    first token and second token must follow p."""
    n, v, k = 60000, 5, 2
    p = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    q = torch.tensor([0.05, 0.1, 0.15, 0.3, 0.4])
    seeds = torch.arange(n)
    kind = seeds % 3  # 0: sampled from q, 1: a fixed guess, 2: no drafts
    sampling = RowSampling(temperature=torch.ones(n), top_p=torch.ones(n), seeds=seeds)
    sampled = drafts_from(q, seeds, k)
    guess = torch.tensor([1, 4]).expand(n, k)  # a plausible first token, then the target's least likely
    drafts = torch.where((kind == 1)[:, None], guess, sampled)
    draft_probs = torch.where(
        (kind == 1)[:, None, None],
        torch.nn.functional.one_hot(drafts, v).float(),
        q[None, None].expand(n, k, v),
    )
    limits = torch.where(kind == 2, 0, k)
    logits = p.log()[None, None].expand(n, k + 1, v)
    verdict = verify_drafts(logits, drafts, draft_probs, limits, sampling, torch.zeros(n, dtype=torch.long))
    first = torch.where(verdict.accepted > 0, drafts[:, 0], verdict.next_tokens)
    second = torch.where(verdict.accepted > 1, drafts[:, 1], verdict.next_tokens)
    for each in range(3):
        rows = kind == each
        assert chi_square(torch.bincount(first[rows], minlength=v).double(), p.double()) < CHI2_999[4]
        two = rows & (verdict.accepted >= 1)  # rows whose second token came from this round
        if each == 2:
            assert not two.any()  # a row drafting nothing emits one token
            continue
        assert chi_square(torch.bincount(second[two], minlength=v).double(), p.double()) < CHI2_999[4]
    assert int((verdict.accepted[kind == 1] > 0).sum()) > 1000  # the fixed guess was often kept


def test_greedy_rows_accept_exactly_the_targets_argmax() -> None:
    logits = torch.tensor([[[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]]])  # argmaxes 1, 0, 2
    sampling = RowSampling(torch.zeros(1), torch.ones(1), torch.zeros(1, dtype=torch.long), all_greedy=True)
    for drafts, accepted, following in (([1, 0], 2, 2), ([1, 2], 1, 0), ([0, 0], 0, 1)):
        verdict = verify_drafts(
            logits, torch.tensor([drafts]), None, torch.tensor([2]), sampling, torch.zeros(1)
        )
        assert (int(verdict.accepted), int(verdict.next_tokens)) == (accepted, following)
    cut = verify_drafts(logits, torch.tensor([[1, 0]]), None, torch.tensor([1]), sampling, torch.zeros(1))
    assert (int(cut.accepted), int(cut.next_tokens), bool(cut.rejected)) == (
        1,
        0,
        False,
    )  # stopped at its limit


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


def second_token_distribution(model, ids: list[int], temperature: float) -> torch.Tensor:
    """The exact marginal of the second new token: Σ_t1 p(t1) p(t2 | t1)."""
    with torch.no_grad():
        first = torch.softmax(model(torch.tensor([ids])).logits[0, -1] / temperature, -1)  # (V,)
        grid = torch.cat([torch.tensor([ids]).expand(len(first), -1), torch.arange(len(first))[:, None]], 1)
        second = torch.softmax(model(grid).logits[:, -1] / temperature, -1)  # (V, V)
    return first @ second


def test_second_tokens_follow_the_target_not_the_draft(peaked_pair) -> None:
    target, draft, tokenizer = peaked_pair
    ids = tokenizer("def foo(x):")["input_ids"]
    p_target = second_token_distribution(target, ids, 1.0)
    p_draft = second_token_distribution(draft, ids, 1.0)
    top = sorted(set(p_target.topk(4).indices.tolist()) | set(p_draft.topk(4).indices.tolist()))[:7]
    assert 0.5 * float((p_target[top] - p_draft[top]).abs().sum()) > 0.3, (
        "the test needs a draft that disagrees"
    )

    engine = Engine(target, DraftModel(draft), max_rows=64, k_max=2, fixed_k=2, costs=flat_costs(2))
    samples = 3000
    rows = [Request(key=s, input_ids=ids, max_new_tokens=3, temperature=1.0, seed=s) for s in range(samples)]
    counts = Counter(done.token_ids[1] for done in engine.generate(rows))
    observed = torch.tensor(
        [counts[t] for t in top] + [samples - sum(counts[t] for t in top)], dtype=torch.double
    )
    expected = torch.cat([p_target[top], (1 - p_target[top].sum()).reshape(1)]).double()
    assert engine.stats.accepted > 0 and engine.stats.rejections > 0  # both branches of the rule ran
    assert chi_square(observed, expected) < CHI2_999[len(top) - 1 if len(top) > 4 else 4]
    wrong = torch.cat([p_draft[top], (1 - p_draft[top].sum()).reshape(1)]).double()
    assert chi_square(observed, wrong) > 100


def test_seeded_rows_repeat_exactly_at_any_batch_size(peaked_pair) -> None:
    target, draft, tokenizer = peaked_pair
    ids = tokenizer("import os")["input_ids"]
    mine = Request(key=0, input_ids=ids, max_new_tokens=16, temperature=0.8, top_p=0.9, seed=7)
    others = [
        Request(
            key=i, input_ids=tokenizer(f"x = {i}")["input_ids"], max_new_tokens=5 + i, temperature=1.0, seed=i
        )
        for i in range(1, 8)
    ]
    outputs = set()
    for batch, company in ((1, []), (8, others), (3, others[:4])):
        engine = Engine(
            target, DraftModel(copy.deepcopy(draft)), max_rows=batch, k_max=3, fixed_k=3, costs=flat_costs(3)
        )
        results = {done.key: done for done in engine.generate([*company, mine])}
        outputs.add(tuple(results[0].token_ids))
    assert len(outputs) == 1
    greedy = request(0, ids, 16)
    engine = Engine(target, DraftModel(draft), max_rows=1, k_max=3, fixed_k=3, costs=flat_costs(3))
    seeds = {
        tuple(done.token_ids)
        for done in engine.generate(
            [Request(key=s, input_ids=ids, max_new_tokens=16, temperature=0.8, seed=s) for s in range(5)]
        )
    }
    assert len(seeds) > 1 and greedy.greedy
