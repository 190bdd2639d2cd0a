"""The engine's policies: the draft length it picks, probe rounds, stop sequences, plain twins
(draft_limit=0) — on tiny random models. The K/V budget and out-of-memory recovery: test_kv_budget.py."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from genjob.generation.costs import CostModel, choose_draft_length, expected_speedup, expected_tokens
from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import Engine
from genjob.generation.loading import load_model, load_tokenizer
from genjob.generation.proposers import NgramIndex, PromptLookup
from genjob.generation.requests import Request, Row, RowStats
from genjob.generation.stopping import cut_at_stop, stop_check
from tests.support.engine import Reference, flat_costs, perturbed, request, syncs_in_one_round
from tests.support.models import build_model, build_tokenizer


@pytest.fixture(scope="module")
def target(tiny_pair: tuple[Path, Path]):
    return load_model(str(tiny_pair[0]))


def costs(draft_step: float, verify: list[float]) -> CostModel:
    queries = list(range(1, len(verify) + 1))
    return CostModel([1], queries, {1: verify}, {1: draft_step}, context=64)


def test_the_draft_length_follows_acceptance_and_cost() -> None:
    cheap = costs(0.02, [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3])
    assert choose_draft_length(cheap, [0.9], [6], k_max=6, current=0) == 6
    assert choose_draft_length(cheap, [0.05], [6], k_max=6, current=3) == 0
    dear = costs(1.0, [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3])  # a draft as slow as the target
    assert choose_draft_length(dear, [0.9], [6], k_max=6, current=2) == 0
    assert choose_draft_length(cheap, [0.9], [0], k_max=6, current=0) == 0  # no room for drafts
    # hysteresis: a k close to the best is kept
    assert choose_draft_length(cheap, [0.6], [6], k_max=6, current=3) == 3
    # ... but not on the way down to plain decoding: k = 0 is taken as soon as it pays best
    level = costs(0.0, [1.0, 1.99, 2.98])  # k = 1 at α = 0.985 yields 1.985 tokens for 1.99 s
    assert choose_draft_length(level, [0.985], [2], k_max=1, current=1) == 0
    assert choose_draft_length(level, [0.995], [2], k_max=1, current=0) == 0  # up: within the margin


def test_one_slow_round_does_not_keep_a_draft_length_out_of_use() -> None:
    """A k run for the first time starts from its nearest neighbour's scale: one stalled round
    (a busy host) moves it by a little, so the best k stays in use; an unseen k borrows the nearest."""
    model = costs(0.02, [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3])
    model.observe(1, 1, model.predicted(1, 1) * 1.1)  # the first round of all sets the scale
    assert model.scale_for(1) == pytest.approx(1.1)
    assert model.scale_for(4) == pytest.approx(1.1)  # not yet run: the nearest k's
    model.observe(1, 3, model.predicted(1, 3) * 5.0)  # one stalled round at k = 3
    assert model.scale_for(3) < 1.3
    assert choose_draft_length(model, [0.8] * 4, [6] * 4, k_max=6, current=3) >= 3
    model.observe(1, 5, model.predicted(1, 5) * 0.8)  # faster than the neighbour: followed quickly
    assert model.scale_for(5) < model.scale_for(3) - 0.1
    assert model.scale_for(6) == model.scale_for(5)


def test_what_the_grid_misses_is_a_scale_so_draft_lengths_compare_at_any_batch() -> None:
    """Live rounds cost 1.6x the grid at every batch size. Plain rounds were seen at a full batch of 64,
    k = 1 only while the batch was 16 (a group's tail): with additive residuals k = 1 looked 60 ms
    cheaper than it is at 64 rows and was chosen where plain decoding pays best."""
    verify = {16: [0.05, 0.06], 64: [0.12, 0.16]}
    model = CostModel([16, 64], [1, 2], verify, {16: 0.0, 64: 0.0}, context=64)
    for _ in range(20):
        model.observe(64, 0, 1.6 * 0.12)
        model.observe(16, 1, 1.6 * 0.06)
    assert model.round_seconds(64, 1) == pytest.approx(1.6 * 0.16)
    assert model.round_seconds(64, 0) == pytest.approx(1.6 * 0.12)
    # 64 rows at α = 0.3 with a draft each: 64 · 1.3 tokens for 0.256 s against 64 for 0.192 s
    assert choose_draft_length(model, [0.3] * 64, [1] * 64, k_max=1, current=0) == 0


def test_expected_speedup_is_leviathans_with_the_measured_verify_cost() -> None:
    model = costs(0.1, [1.0, 1.2, 1.4, 1.6])
    alpha, k = 0.8, 3
    expected = expected_tokens(alpha, k) * 1.0 / (k * 0.1 + 1.6)
    assert expected_speedup(model, alpha, {3: 10}, 1.0) == pytest.approx(expected)
    assert expected_tokens(0.8, 3) == pytest.approx((1 - 0.8**4) / 0.2)
    assert expected_speedup(model, alpha, {}, 1.0) is None


def test_expected_speedup_counts_the_drafts_each_row_really_had() -> None:
    """Prompt lookup: 10 rounds at k = 3 in a batch of 2, where 12 of the 20 row-rounds found no n-gram
    to propose. Those rows gain one token from a verification priced at k = 3."""
    model = CostModel(
        [1, 2], [1, 2, 3, 4], {1: [1.0, 1.2, 1.4, 1.6], 2: [1.5, 1.8, 2.1, 2.4]}, {1: 0, 2: 0}, 64
    )
    alpha = 0.8
    every_row = expected_speedup(model, alpha, {3: 10}, 2.0)
    assert every_row == expected_speedup(model, alpha, {3: 10}, 2.0, {3: 20})
    assert every_row == pytest.approx(expected_tokens(alpha, 3) * 1.5 / 2.4)
    mean_tokens = (12 * 1 + 8 * expected_tokens(alpha, 3)) / 20
    assert expected_speedup(model, alpha, {3: 10}, 2.0, {0: 12, 3: 8}) == pytest.approx(
        mean_tokens * 1.5 / 2.4
    )


def test_a_draft_that_costs_more_than_it_saves_leaves_rows_to_plain_decoding() -> None:
    """A draft step dearer than a verification, for a target it never agrees with: the costs (and the
    live rounds) make k = 0 the best choice, so the rounds are plain but for the exploration ones. The
    costs are given, not timed: a busy machine must not decide a test."""
    tokenizer = build_tokenizer()
    target = build_model(tokenizer, n_layer=1, n_embd=32, seed=3)
    draft = build_model(tokenizer, n_layer=6, n_embd=128, seed=4)
    costs = flat_costs(8, draft_step=5.0)
    engine = Engine(target, DraftModel(draft), max_rows=4, k_max=8, costs=costs)
    requests = [request(i, tokenizer(f"def f{i}(x):")["input_ids"], 40) for i in range(4)]
    list(engine.generate(requests))
    hist = engine.stats.gamma_hist
    assert hist[0] / sum(hist.values()) > 0.7, hist


def test_probe_rounds_decode_plainly_and_are_counted(target, tiny_pair) -> None:
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    engine = Engine(
        target,
        DraftModel(copy.deepcopy(target)),
        max_rows=3,
        k_max=4,
        fixed_k=4,
        costs=flat_costs(4),
        probe_every=5,
    )
    requests = [request(i, tokenizer("import os")["input_ids"], 40) for i in range(3)]
    results = list(engine.generate(requests))
    stats = engine.stats
    assert stats.probe_rounds == stats.rounds // 5 > 0
    assert stats.probe_tokens == sum(1 for _ in range(stats.probe_rounds)) * 0 + stats.probe_tokens
    assert stats.gamma_hist == {4: stats.rounds - stats.probe_rounds}
    reference = Reference(target)
    assert all(done.token_ids == reference(requests[0].input_ids, 40, None) for done in results)


def test_a_plain_twin_is_plain_decoding_in_the_same_batch(target, tiny_pair) -> None:
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    ids = tokenizer("class A:")["input_ids"]
    engine = Engine(
        target, DraftModel(perturbed(target, 1e-3)), max_rows=2, k_max=4, fixed_k=4, costs=flat_costs(4)
    )
    twin = request(-1, ids, 30)
    twin = type(twin)(key=-1, input_ids=ids, max_new_tokens=30, draft_limit=0)
    results = {done.key: done for done in engine.generate([request(1, ids, 30), twin])}
    assert results[1].token_ids == results[-1].token_ids
    assert results[-1].stats.draft_accepted == 0 and results[-1].stats.target_rounds == 30
    assert results[1].stats.draft_accepted > 0


def test_stop_sequences_end_a_row_and_cut_its_text(target, tiny_pair) -> None:
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    ids = tokenizer("def foo(x):")["input_ids"]
    full = Reference(target)(ids, 30, None)
    text = tokenizer.decode(full)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    check = stop_check(tokenizer, [stop])
    one = type(request(0, ids, 30))(key=0, input_ids=ids, max_new_tokens=30, stop=check)
    engine = Engine(target, PromptLookup(), max_rows=1, k_max=4, costs=flat_costs(4))
    (done,) = list(engine.generate([one]))
    assert done.stats.finish_reason == "stop"
    kept = tokenizer.decode(done.token_ids)
    assert stop in kept and stop not in tokenizer.decode(done.token_ids[:-1])
    assert done.token_ids == full[: len(done.token_ids)]
    assert cut_at_stop(kept, [stop]) == text[: text.index(stop)]


def test_the_ngram_index_finds_the_latest_earlier_occurrence() -> None:
    index = NgramIndex(max_n=3)
    context = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert index.lookup(context, 2) == [7, 8]  # the latest earlier "1 2 3" was followed by 7 8
    assert index.lookup([*context, 5], 3) == []  # "5", "3 5", "2 3 5" never seen before
    assert NgramIndex(max_n=3).lookup([4, 4], 5) == [4]


def test_a_proposers_state_for_a_row_is_its_own_and_goes_with_the_row() -> None:
    """The n-gram index of a row lives in the proposer (the ``Row`` holds none), keyed by the row itself:
    two rows with equal tokens have two indices, and a row's index is dropped once the row is gone."""
    import gc

    proposer = PromptLookup()
    rows = [Row(request=Request(key=0, input_ids=[1, 2, 3, 1, 2], max_new_tokens=4), stats=RowStats())]
    rows.append(copy.deepcopy(rows[0]))
    assert proposer.available(rows, 2) == [2, 2]  # "1 2" was followed by 3 1
    assert proposer.ngrams(rows[0]) is not proposer.ngrams(rows[1])
    del rows[1]
    gc.collect()
    assert len(proposer.ngrams) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: host syncs are its matter")
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_round_waits_for_the_device_once(target, tiny_pair, temperature) -> None:
    """Between draft steps and before the verification nothing waits for the GPU: the round's one host
    sync is the read of its outcome (host values reach the device through ``to_device``)."""
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    device = torch.device("cuda")
    engine = Engine(
        copy.deepcopy(target).to(device),
        DraftModel(perturbed(target, 1e-3).to(device)),
        max_rows=4,
        k_max=4,
        fixed_k=3,
        costs=flat_costs(4),
    )
    ids = tokenizer("def f(x):")["input_ids"]
    engine.add(
        Request(key=i, input_ids=ids, max_new_tokens=40, temperature=temperature, seed=i) for i in range(4)
    )
    syncs = syncs_in_one_round(engine)
    assert len(syncs) == 1, syncs
