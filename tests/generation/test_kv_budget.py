"""The batch's memory: rows admitted within the K/V budget (GENJOB_KV_CACHE_BYTES and, on CUDA, the
device's room), the batch halved after an out-of-memory error and grown back as rows leave, the K/V
caches given back by ``release`` — on tiny random models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genjob.generation import engine as engine_module
from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import Engine
from genjob.generation.kv_budget import Admission, Held, plan_admission
from genjob.generation.loading import load_model, load_tokenizer
from tests.support.engine import Reference, flat_costs, perturbed, request


@pytest.fixture(scope="module")
def target(tiny_pair: tuple[Path, Path]):
    return load_model(str(tiny_pair[0]))


@pytest.fixture(scope="module")
def prompt(tiny_pair: tuple[Path, Path]) -> list[int]:
    return list(load_tokenizer(str(tiny_pair[0]))("for i in range(3):")["input_ids"])


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(rows, slots) of every round the engines decode."""
    seen: list[tuple[int, int]] = []
    real = Engine._round_of_decoding

    def spy(self):
        seen.append((len(self.rows), self.cache.slots))
        return real(self)

    monkeypatch.setattr(Engine, "_round_of_decoding", spy)
    return seen


def test_the_plan_admits_rows_while_the_caches_fit() -> None:
    empty = Held(slots=0, capacity=0, rows=0)  # rows of 100 tokens at 10 bytes a token: 1,000 bytes each
    assert plan_admission(empty, [], [100] * 10, limit=8, budget=3500, per_token=10) == Admission(3, 3, 100)
    assert plan_admission(empty, [], [100] * 10, limit=8, budget=None, per_token=10) == Admission(8, 8, 100)
    assert plan_admission(empty, [], [1000], limit=8, budget=3500, per_token=10).rows == 1  # one at least
    # two rows held: a third grows the caches (the slots by doubling, as far as the budget allows)
    two = Held(slots=2, capacity=100, rows=2)
    assert plan_admission(two, [100, 100], [100], limit=8, budget=2999, per_token=10).rows == 0
    assert plan_admission(two, [100, 100], [100], limit=8, budget=3000, per_token=10) == Admission(1, 3, 100)
    assert plan_admission(two, [100, 100], [100], limit=8, budget=None, per_token=10) == Admission(1, 4, 100)
    # a longer row widens every slot: 3 × 300 tokens
    assert plan_admission(two, [100, 100], [300], limit=8, budget=8999, per_token=10).rows == 0
    assert plan_admission(two, [100, 100], [300], limit=8, budget=9000, per_token=10).rows == 1
    # into an empty batch the buffers held serve if large enough, else fresh ones replace them (no copy)
    idle = Held(slots=4, capacity=100, rows=0)
    assert plan_admission(idle, [], [100] * 2, limit=8, budget=None, per_token=10) == Admission(2, 4, 100)
    fresh = plan_admission(idle, [], [300] * 2, limit=8, budget=6000, per_token=10)
    assert fresh == Admission(2, 2, 300, fresh=True)


def test_the_budget_bounds_the_rows_admitted(target, prompt, rounds) -> None:
    engine = Engine(target, None, max_rows=8, k_max=0, costs=flat_costs(0))
    per_row = engine.cache.bytes_per_token() * (len(prompt) + 20 + 1)
    engine.room.kv_budget_bytes = 3 * per_row
    engine.add([request(0, prompt, 20)])
    assert engine.free_rows == 2
    requests = [request(i, prompt, 20) for i in range(1, 8)]
    results = {done.key: done.token_ids for done in engine.generate(requests)}
    assert max(rows for rows, _ in rounds) == 3 and max(slots for _, slots in rounds) == 3
    expected = Reference(target)(prompt, 20, None)
    assert all(tokens == expected for tokens in results.values()) and len(results) == 8


def test_the_device_room_bounds_the_rows_too(target, prompt, rounds, monkeypatch) -> None:
    """On CUDA the device's room (free memory after the weights, less a margin) is read whenever the
    caches are empty; the setting, when lower, wins."""
    engine = Engine(target, DraftModel(perturbed(target, 1e-3)), max_rows=8, k_max=2, costs=flat_costs(2))
    per_row = engine._bytes_per_token() * (len(prompt) + 12 + 2 + 1)  # target's and draft's caches
    reads: list[int] = []

    def room(device: torch.device) -> int:
        reads.append(engine.cache.held_bytes())
        return 2 * per_row

    monkeypatch.setattr(engine_module, "device_room", room)
    done = list(engine.generate([request(i, prompt, 12) for i in range(6)]))
    assert len(done) == 6 and max(rows for rows, _ in rounds) == 2
    assert reads and set(reads) == {0}  # read with nothing held, once per fresh start of the batch
    rounds.clear()
    engine.room.kv_budget_bytes = per_row
    assert len(list(engine.generate([request(i, prompt, 12) for i in range(3)]))) == 3
    assert max(rows for rows, _ in rounds) == 1


def test_out_of_memory_halves_the_batch_and_it_grows_back(target, tiny_pair, rounds, monkeypatch) -> None:
    """A job after an out-of-memory halving ends with its batch back at its size; nothing is lost."""
    tokenizer = load_tokenizer(str(tiny_pair[0]))
    engine = Engine(
        target, DraftModel(perturbed(target, 1e-3)), max_rows=8, k_max=3, fixed_k=3, costs=flat_costs(3)
    )
    real = Engine._round_of_decoding
    calls = {"n": 0}

    def flaky(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self)

    monkeypatch.setattr(Engine, "_round_of_decoding", flaky)
    prompts = [tokenizer(f"for i in range({i}):")["input_ids"] for i in range(4)]
    requests = [request(i, prompts[i % 4], 8 + 4 * (i % 3)) for i in range(16)]
    results = {done.key: done for done in engine.generate(requests)}
    assert engine.stats.oom_events == 1
    after = [rows for rows, _ in rounds[2:]]  # the rounds after the failed one
    assert after[0] == 4 and max(after) == 8  # halved, then back at the batch's size
    assert engine.row_limit == engine.max_rows == 8 and engine.room.oom_cap is None
    reference = Reference(target)
    for one in requests:
        assert results[one.key].token_ids == reference(one.input_ids, one.max_new_tokens, None)


def test_out_of_memory_with_one_row_is_raised(target, prompt, monkeypatch) -> None:
    engine = Engine(target, None, max_rows=4, k_max=0, costs=flat_costs(0))

    def broke(self):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(Engine, "_round_of_decoding", broke)
    engine.add([request(0, prompt, 5)])
    with pytest.raises(torch.OutOfMemoryError, match="single row"):
        engine.step()


def test_release_gives_both_caches_back(target, prompt) -> None:
    draft = DraftModel(perturbed(target, 1e-3))
    engine = Engine(target, draft, max_rows=4, k_max=2, costs=flat_costs(2))
    engine.add([request(i, prompt, 30) for i in range(4)])
    engine.step()
    assert engine.cache.held_bytes() > 0 and draft.cache.held_bytes() > 0
    engine.release()  # mid-decoding: the rows wait again, their tokens kept
    assert engine.cache.held_bytes() == 0 and draft.cache.held_bytes() == 0
    assert len(engine.waiting) == 4 and not engine.rows
    results = {done.key: done.token_ids for done in engine.generate([])}
    expected = Reference(target)(prompt, 30, None)
    assert len(results) == 4 and all(tokens == expected for tokens in results.values())
