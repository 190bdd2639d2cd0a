"""Batched assisted generation (worker/batched.py) is lossless and its stats add up.

Every row is compared with the target's own plain greedy decode of that prompt alone
(transformers ``generate``, batch 1, fp32), over random prompt sets, batch sizes up to 16 and
draft lengths 1..6, with three drafts: the tiny random draft (rejects nearly everything), a
slightly perturbed copy of the target (accepts some, rejects some: ragged rows every round) and
an exact copy (accepts everything).
"""

from __future__ import annotations

import copy
import sysconfig
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genjob.generation.batched import BatchRequest, speculative_decode_batch
from genjob.generation.loading import load_model, load_tokenizer

REFERENCE_TOKENS = 40  # greedy with max_new_tokens=k is the first k tokens of this decode
DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"


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


def decode_all(target, draft, requests, **kwargs) -> dict:
    results = dict(speculative_decode_batch(target, draft, requests, **kwargs))
    assert sorted(results) == sorted(r.key for r in requests)
    return results


def check_row(request: BatchRequest, decoded, expected: list[int], eos: int | None) -> None:
    assert decoded.token_ids == expected, request
    stats = decoded.stats
    assert stats.prompt_tokens == len(request.input_ids)
    assert stats.new_tokens == len(decoded.token_ids) <= request.max_new_tokens
    assert 0 <= stats.draft_accepted <= stats.draft_proposed
    assert stats.target_rounds + stats.draft_accepted == stats.new_tokens
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
    gamma=st.integers(min_value=1, max_value=6),
    which=st.sampled_from(["random", "perturbed", "twin"]),
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
    requests = [BatchRequest(key=i, input_ids=POOL[p], max_new_tokens=n) for i, (p, n) in enumerate(chosen)]
    results = decode_all(
        target, drafts[which], requests, batch_size=batch_size, draft_tokens=gamma, eos_token_id=eos
    )
    for request in requests:
        expected = reference(request.input_ids, request.max_new_tokens, eos)
        check_row(request, results[request.key], expected, eos)


def stem_requests(tokenizer, count: int, max_new: list[int]) -> list[BatchRequest]:
    stems = ["def ", "import os\n", "class Parser:\n    def __init__(self):", "for i in range(10):", "x"]
    return [
        BatchRequest(
            key=100 + i,
            input_ids=tokenizer(f"{stems[i % len(stems)]}item_{i}")["input_ids"],
            max_new_tokens=max_new[i % len(max_new)],
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
    for key, decoded in speculative_decode_batch(
        target, drafts["perturbed"], queue(), batch_size=4, draft_tokens=4, eos_token_id=None
    ):
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
    results = decode_all(target, drafts["twin"], requests, batch_size=8, draft_tokens=5)
    for request in requests:
        stats = results[request.key].stats
        check_row(
            request, results[request.key], reference(request.input_ids, request.max_new_tokens, None), None
        )
        assert stats.draft_accepted == stats.draft_proposed > 0
        assert stats.target_rounds <= 1 + -(-(request.max_new_tokens - 1) // 6)  # 6 tokens per round


def test_perturbed_draft_gives_ragged_acceptance(pair, drafts, tiny_pair) -> None:
    target, _ = pair
    requests = stem_requests(load_tokenizer(str(tiny_pair[0])), 10, [40])
    results = decode_all(target, drafts["perturbed"], requests, batch_size=10, draft_tokens=4)
    accepted = sum(r.stats.draft_accepted for r in results.values())
    proposed = sum(r.stats.draft_proposed for r in results.values())
    assert 0.2 < accepted / proposed < 0.95  # the fixture really exercises partial acceptance
    assert len({r.stats.target_rounds for r in results.values()}) > 1


@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_without_a_draft_it_is_batched_plain_greedy(pair, reference, tiny_pair, batch_size) -> None:
    target, _ = pair
    requests = stem_requests(load_tokenizer(str(tiny_pair[0])), 9, [1, 20, 40])
    results = decode_all(target, None, requests, batch_size=batch_size, draft_tokens=5)
    for request in requests:
        decoded = results[request.key]
        check_row(request, decoded, reference(request.input_ids, request.max_new_tokens, None), None)
        assert decoded.stats.target_rounds == decoded.stats.new_tokens
        assert decoded.stats.draft_proposed == 0


def test_rows_near_the_context_limit_never_pass_it(tmp_path: Path) -> None:
    """Drafts beyond a row's last position are clamped, never looked up past the position table."""
    from model_factory import build_model, build_tokenizer

    tokenizer = build_tokenizer(vocab_size=300)
    target = build_model(tokenizer, n_layer=1, n_embd=32, seed=5)
    target.config.n_positions = 48
    target.transformer.wpe.weight.data = target.transformer.wpe.weight.data[:48]
    twin = copy.deepcopy(target)
    requests = [
        BatchRequest(key=i, input_ids=list(range(1, 1 + length)), max_new_tokens=48 - length)
        for i, length in enumerate([10, 30, 45, 47])
    ]
    results = decode_all(target, twin, requests, batch_size=4, draft_tokens=6)
    reference = Reference(target)
    for request in requests:
        expected = reference(request.input_ids, request.max_new_tokens, None)
        check_row(request, results[request.key], expected, None)


@pytest.mark.skipif(not (DEMO / "target").exists(), reason="demo pair not built (models/demo)")
def test_demo_pair_is_lossless_at_every_batch_size() -> None:
    target, draft = load_model(str(DEMO / "target")), load_model(str(DEMO / "draft"))
    tokenizer = load_tokenizer(str(DEMO / "target"))
    eos = tokenizer.eos_token_id
    reference = Reference(target)
    source = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"
    lines = [line.strip()[:60] for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    requests = [
        BatchRequest(key=i, input_ids=tokenizer(line)["input_ids"], max_new_tokens=8 + i % 33)
        for i, line in enumerate(lines[:32])
    ]
    for batch_size in (3, 16):
        results = decode_all(target, draft, requests, batch_size=batch_size, draft_tokens=5, eos_token_id=eos)
        for request in requests:
            expected = reference(request.input_ids, request.max_new_tokens, eos)
            check_row(request, results[request.key], expected, eos)


@pytest.mark.parametrize(
    ("input_ids", "max_new_tokens", "message"),
    [([], 8, "empty input_ids"), ([5, 6], 0, "max_new_tokens must be >= 1")],
)
def test_a_bad_request_is_refused_before_it_joins_a_batch(input_ids, max_new_tokens, message) -> None:
    with pytest.raises(ValueError, match=message):
        BatchRequest(key=7, input_ids=input_ids, max_new_tokens=max_new_tokens)
