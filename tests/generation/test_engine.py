"""The engine (genjob.generation.engine) is lossless under greedy decoding and its stats add up.

Every row is compared with the target's own plain greedy decode of that prompt alone
(transformers ``generate``, batch 1, fp32: the oracle), over random prompt sets, batch sizes up to
16 and draft lengths 0..6, with four proposers: the tiny random draft (rejects nearly everything), a
slightly perturbed copy of the target (accepts some, rejects some: ragged rows every round), an
exact copy (accepts everything) and prompt lookup.
"""

from __future__ import annotations

import copy
import sysconfig
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import Engine
from genjob.generation.loading import load_model, load_tokenizer
from genjob.generation.proposers import PromptLookup
from genjob.generation.requests import Request
from tests.support.engine import DEMO, REFERENCE_TOKENS, Reference, flat_costs, perturbed, request


@pytest.fixture(scope="module")
def pair(tiny_pair: tuple[Path, Path]):
    target, draft = tiny_pair
    return load_model(str(target)), load_model(str(draft))


@pytest.fixture(scope="module")
def drafts(pair):
    target, draft = pair
    return {"random": draft, "perturbed": perturbed(target, 1e-3), "twin": copy.deepcopy(target)}


@pytest.fixture(scope="module")
def reference(pair) -> Reference:
    return Reference(pair[0])


def proposer_for(target, which: str, drafts: dict):
    if which == "none":
        return None
    if which == "lookup":
        return PromptLookup()
    return DraftModel(drafts[which])


def decode_all(target, proposer, requests, *, batch_size: int, gamma: int | None = None, **kwargs) -> dict:
    """Decode with a constant γ (``gamma``), or the goodput choice up to 6 when None."""
    k_max = 6 if gamma is None else max(gamma, 0)
    engine = Engine(
        target, proposer, max_rows=batch_size, k_max=k_max, fixed_k=gamma, costs=flat_costs(k_max), **kwargs
    )
    results = {done.key: done for done in engine.generate(requests)}
    assert sorted(results) == sorted(r.key for r in requests)
    return results


def check_row(request: Request, decoded, expected: list[int], eos: int | None) -> None:
    assert decoded.token_ids == expected, request
    stats = decoded.stats
    assert stats.prompt_tokens == len(request.input_ids)
    assert stats.new_tokens == len(decoded.token_ids) <= request.max_new_tokens
    assert 0 <= stats.draft_accepted <= stats.draft_proposed
    assert stats.target_rounds + stats.draft_accepted == stats.new_tokens
    assert stats.draft_rejections <= stats.target_rounds
    stopped = eos is not None and decoded.token_ids[-1] == eos
    assert stats.finish_reason == ("stop" if stopped else "length")
    assert 0 < stats.latency_s <= stats.wall_s


POOL = [
    [int(t) for t in torch.randint(0, 384, (int(n),), generator=torch.Generator().manual_seed(i))]
    for i, n in enumerate(torch.randint(1, 25, (64,), generator=torch.Generator().manual_seed(64)))
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=st.lists(
        st.tuples(st.integers(0, len(POOL) - 1), st.integers(1, REFERENCE_TOKENS)), min_size=1, max_size=20
    ),
    batch_size=st.integers(min_value=1, max_value=16),
    gamma=st.one_of(st.none(), st.integers(min_value=0, max_value=6)),
    which=st.sampled_from(["random", "perturbed", "twin", "lookup", "none"]),
    eos_from=st.one_of(st.none(), st.tuples(st.integers(0, len(POOL) - 1), st.integers(0, 15))),
)
def test_every_row_equals_its_own_plain_greedy_decode(
    pair, drafts, reference, chosen, batch_size, gamma, which, eos_from
) -> None:
    """Random prompt sets (from a pool of 64 random prompts of 1..24 tokens, so that each plain
    decode is computed once), random max_new_tokens, and an EOS that greedy decoding really
    produces mid-sequence (a token of some prompt's reference), or none."""
    target, _ = pair
    eos = None if eos_from is None else reference.decode(POOL[eos_from[0]])[eos_from[1]]
    requests = [request(i, POOL[p], n, eos) for i, (p, n) in enumerate(chosen)]
    results = decode_all(
        target, proposer_for(target, which, drafts), requests, batch_size=batch_size, gamma=gamma
    )
    for one in requests:
        expected = reference(one.input_ids, one.max_new_tokens, eos)
        check_row(one, results[one.key], expected, eos)


def stem_requests(tokenizer, count: int, max_new: list[int]) -> list[Request]:
    stems = ["def ", "import os\n", "class Parser:\n    def __init__(self):", "for i in range(10):", "x"]
    return [
        request(
            100 + i, tokenizer(f"{stems[i % len(stems)]}item_{i}")["input_ids"], max_new[i % len(max_new)]
        )
        for i in range(count)
    ]


def test_rows_finish_early_and_the_queue_refills_the_batch(pair, drafts, reference, tiny_pair) -> None:
    target, _ = pair
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    requests = stem_requests(tokenizer, 13, [1, 2, 35, 5, 17, 40, 3])
    pulled: list[int] = []

    def queue():
        for request in requests:
            pulled.append(request.key)
            yield request

    finished = []
    engine = Engine(
        target, DraftModel(drafts["perturbed"]), max_rows=4, k_max=4, fixed_k=4, costs=flat_costs(4)
    )
    for decoded in engine.generate(queue()):
        key = decoded.key
        in_flight = len(pulled) - len(finished)
        assert in_flight <= 4  # a request is pulled only when a slot is free
        finished.append(key)
        request = next(r for r in requests if r.key == key)
        check_row(request, decoded, reference(request.input_ids, request.max_new_tokens, None), None)
    assert sorted(finished) == [r.key for r in requests]
    assert finished != [r.key for r in requests]  # short rows left before long ones
    assert finished[0] == requests[0].key  # max_new_tokens 1: done at its prefill


def test_exact_copy_as_draft_accepts_every_proposal(pair, drafts, reference, tiny_pair) -> None:
    target, _ = pair
    requests = stem_requests(load_tokenizer(str(tiny_pair[0])), 8, [30, 12, 40])
    results = decode_all(target, DraftModel(drafts["twin"]), requests, batch_size=8, gamma=5)
    for one in requests:
        stats = results[one.key].stats
        check_row(one, results[one.key], reference(one.input_ids, one.max_new_tokens, None), None)
        assert stats.draft_accepted == stats.draft_proposed > 0 and stats.draft_rejections == 0
        assert stats.target_rounds <= 1 + -(-(one.max_new_tokens - 1) // 6)  # 6 tokens per round


def test_perturbed_draft_gives_ragged_acceptance(pair, drafts, tiny_pair) -> None:
    target, _ = pair
    requests = stem_requests(load_tokenizer(str(tiny_pair[0])), 10, [40])
    results = decode_all(target, DraftModel(drafts["perturbed"]), requests, batch_size=10, gamma=4)
    accepted = sum(r.stats.draft_accepted for r in results.values())
    proposed = sum(r.stats.draft_proposed for r in results.values())
    assert 0.2 < accepted / proposed < 0.95  # the fixture really exercises partial acceptance
    assert len({r.stats.target_rounds for r in results.values()}) > 1


@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_without_a_draft_it_is_batched_plain_greedy(pair, reference, tiny_pair, batch_size) -> None:
    target, _ = pair
    requests = stem_requests(load_tokenizer(str(tiny_pair[0])), 9, [1, 20, 40])
    results = decode_all(target, None, requests, batch_size=batch_size, gamma=0)
    for one in requests:
        decoded = results[one.key]
        check_row(one, decoded, reference(one.input_ids, one.max_new_tokens, None), None)
        assert decoded.stats.target_rounds == decoded.stats.new_tokens
        assert decoded.stats.draft_proposed == 0


def test_rows_near_the_context_limit_never_pass_it(tmp_path: Path) -> None:
    """Drafts beyond a row's last position are clamped, never looked up past the position table."""
    from tests.support.models import build_model, build_tokenizer

    tokenizer = build_tokenizer(vocab_size=300)
    target = build_model(tokenizer, n_layer=1, n_embd=32, seed=5)
    target.config.n_positions = 48
    target.transformer.wpe.weight.data = target.transformer.wpe.weight.data[:48]
    twin = copy.deepcopy(target)
    requests = [
        request(i, list(range(1, 1 + length)), 48 - length) for i, length in enumerate([10, 30, 45, 47])
    ]
    reference = Reference(target)
    for proposer in (DraftModel(twin), PromptLookup()):
        results = decode_all(target, proposer, requests, batch_size=4, gamma=6)
        for one in requests:
            expected = reference(one.input_ids, one.max_new_tokens, None)
            check_row(one, results[one.key], expected, None)
    with pytest.raises(ValueError, match="exceeds the model's context of 48"):
        Engine(target, None, max_rows=1, k_max=0, costs=flat_costs(0)).add([request(9, [1] * 40, 9)])


@pytest.mark.skipif(not (DEMO / "target").exists(), reason="demo pair not built (models/demo)")
def test_demo_pair_is_lossless_at_every_batch_size() -> None:
    target, draft = load_model(str(DEMO / "target")), load_model(str(DEMO / "draft"))
    tokenizer = load_tokenizer(str(DEMO / "target"))
    eos = tokenizer.eos_token_id
    reference = Reference(target)
    source = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"
    lines = [line.strip()[:60] for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    requests = [
        request(i, tokenizer(line)["input_ids"], 8 + i % 33, eos) for i, line in enumerate(lines[:32])
    ]
    for batch_size, proposer in ((3, DraftModel(draft)), (16, DraftModel(draft)), (16, PromptLookup())):
        results = decode_all(target, proposer, requests, batch_size=batch_size)
        for one in requests:
            expected = reference(one.input_ids, one.max_new_tokens, eos)
            check_row(one, results[one.key], expected, eos)


@pytest.mark.parametrize(
    ("input_ids", "max_new_tokens", "message"),
    [([], 8, "empty input_ids"), ([5, 6], 0, "max_new_tokens must be >= 1")],
)
def test_a_bad_request_is_refused_before_it_joins_a_batch(input_ids, max_new_tokens, message) -> None:
    with pytest.raises(ValueError, match=message):
        Request(key=7, input_ids=input_ids, max_new_tokens=max_new_tokens)
