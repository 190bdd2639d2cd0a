"""Mode auto's per-row choice among proposers (``generation.proposer_mix``): lossless greedy rows with
mixed proposers in one batch, the target's distribution kept for sampled rows drafting from different
proposers in one batch, and a row whose proposer stops paying moving to another, or to no drafts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import Engine
from genjob.generation.loading import load_model, load_tokenizer
from genjob.generation.proposer_mix import EXPLORE_MIN_ROUNDS, ProposerMix
from genjob.generation.proposers import BatchView, ModelFree, PromptLookup, Proposal
from genjob.generation.requests import Request, Row, RowStats
from genjob.generation.sampling import RowSampling
from genjob.proposer_tally import ProposerTally
from tests.generation.test_sampling import (  # noqa: F401 (peaked_pair: a fixture)
    CHI2_999,
    chi_square,
    peaked_pair,
    second_token_distribution,
)
from tests.support.engine import Reference, flat_costs, request, syncs_in_one_round


class Fixed(ModelFree):
    """A proposer that always offers ``tokens`` (to the rows ``offered_to`` accepts), never sampled."""

    def __init__(self, name: str, tokens: list[int], offered_to=lambda row: True) -> None:
        self.name, self.tokens, self.offered_to = name, tokens, offered_to

    def available(self, rows: list[Row], k: int) -> list[int]:
        return [min(k, len(self.tokens)) if self.offered_to(row) else 0 for row in rows]

    def propose(self, view: BatchView, k: int) -> Proposal:
        counts = self.available(view.rows, k)
        guess = (self.tokens + [0] * k)[:k]
        return Proposal(tokens=torch.tensor([guess] * len(view.rows)), counts=counts, probs=None)


class OnlyFor(DraftModel):
    """The draft model, offered only to the rows ``offered_to`` accepts."""

    def __init__(self, model, offered_to) -> None:
        super().__init__(model)
        self.offered_to = offered_to

    def available(self, rows: list[Row], k: int) -> list[int]:
        return [k if self.offered_to(row) else 0 for row in rows]


def row(key: int) -> Row:
    request = Request(key=key, input_ids=[1, 2, 3], max_new_tokens=50)
    return Row(request=request, stats=RowStats(target_rounds=1))


def one_round(mix: ProposerMix, rows: list[Row], k: int, accepted: list[int]) -> None:
    """What the engine does with a proposer in a round that drafts k tokens."""
    mix.available(rows, k)
    b = len(rows)
    sampling = RowSampling(
        temperature=torch.zeros(b), top_p=torch.ones(b), seeds=torch.zeros(b, dtype=torch.long),
        all_greedy=True, any_greedy=True, any_top_p=False,
    )  # fmt: skip
    view = BatchView(rows, torch.zeros(b, dtype=torch.long), sampling, torch.zeros(b, dtype=torch.long))
    proposal = mix.propose(view, k)
    # the engine's cap of each row's drafts
    drafted = [min(k, n, one.remaining - 1) for n, one in zip(proposal.counts, rows, strict=True)]
    mix.advance(rows, [3] * b, accepted, k, drafted)
    for one in rows:
        one.stats.target_rounds += 1


def test_a_row_whose_proposer_stops_paying_moves_to_another_then_to_none() -> None:
    mix = ProposerMix([Fixed("a", [5, 6, 7, 8]), Fixed("b", [5, 6])])
    rows = [row(0)]
    one_round(mix, rows, 4, [4])  # "a" pays
    assert mix.chosen(rows[0]) == "a"
    switched = None
    for n in range(1, 6):  # then "a" is refused every round
        one_round(mix, rows, 4, [0])
        if mix.available(rows, 4) and mix.chosen(rows[0]) == "b":
            switched = n
            break
    assert switched is not None and switched <= 4, "moved to the other proposer within a few rounds"
    for _ in range(6):  # "b" is refused too
        one_round(mix, rows, 4, [0])
    mix.available(rows, 4)
    assert mix.chosen(rows[0]) is None  # no drafts for this row: its k is 0
    tallies = rows[0].stats.by_proposer
    assert tallies["a"].rounds >= 2 and tallies["a"].accepted == 4 and tallies["b"].accepted == 0
    assert mix.totals["a"].accepted == 4


def test_the_draft_length_weighs_the_chosen_proposers_acceptance_not_the_rows_mixed_past() -> None:
    offers = {"a": True, "b": True}
    mix = ProposerMix(
        [Fixed("a", [5, 6, 7, 8], lambda row: offers["a"]), Fixed("b", [5, 6], lambda row: offers["b"])]
    )
    rows = [row(0)]
    for _ in range(3):
        one_round(mix, rows, 4, [4])  # "a" is right every time
    mix.available(rows, 4)
    assert mix.chosen(rows[0]) == "a"
    assert mix.row_acceptance(rows)[0] > 0.9  # type: ignore[operator]
    one_round(mix, rows, 4, [0])  # one miss: the k stays (the row's life with "a"), the fading choice moves
    mix.available(rows, 4)
    steady = mix.row_acceptance(rows)[0]
    assert mix.chosen(rows[0]) == "a" and steady is not None and 0.85 < steady < 0.95
    assert mix.row_alpha(rows[0], "a") < steady - 0.04  # the fading one fell further
    offers["a"] = False  # this round only "b" has tokens: untried, its rate is the prior
    mix.available(rows, 4)
    assert mix.chosen(rows[0]) == "b" and mix.row_acceptance(rows) == [0.5]
    offers["b"] = False
    mix.available(rows, 4)
    assert mix.row_acceptance(rows) == [None]  # no drafts: the engine keeps its own estimate


def test_every_eighth_round_a_row_tries_another_proposer_unless_the_job_found_it_poor() -> None:
    mix = ProposerMix([Fixed("a", [5, 6, 7, 8]), Fixed("b", [5, 6, 7, 8])])
    rows = [row(0)]
    rows[0].stats.target_rounds = 8
    mix.available(rows, 4)
    assert mix.chosen(rows[0]) == "b"  # untried: it might pay
    # the job's rows found "b" right 4 times in 44
    mix.totals["b"] = ProposerTally(rounds=40, proposed=160, accepted=4, rejections=40)
    mix.available(rows, 4)
    assert mix.chosen(rows[0]) == "a"


def test_a_proposer_refused_at_the_jobs_start_is_still_tried_until_the_job_knows_it() -> None:
    """Refused in its first 7 row-rounds, "b" is still tried every 8th round of a row: so few drafts
    at a job's start say little (prompt lookup, so dropped, was right 83 % of the time once tried)."""
    mix = ProposerMix([Fixed("a", [5, 6, 7, 8]), Fixed("b", [5, 6, 7, 8])])
    rows = [row(0)]
    rows[0].stats.target_rounds = 8
    mix.totals["a"] = ProposerTally(rounds=40, proposed=160, accepted=120, rejections=20)
    mix.totals["b"] = ProposerTally(rounds=7, proposed=14, accepted=0, rejections=7)
    mix.available(rows, 4)
    assert mix.chosen(rows[0]) == "b"
    mix.totals["b"] = ProposerTally(rounds=EXPLORE_MIN_ROUNDS, proposed=64, accepted=0, rejections=32)
    mix.available(rows, 4)
    assert mix.chosen(rows[0]) == "a"  # now the job knows it: not worth a try


@pytest.fixture(scope="module")
def models(tiny_pair: tuple[Path, Path]):
    target = load_model(str(tiny_pair[0]))  # its draft: another small model, often wrong
    return target, load_model(str(tiny_pair[1])), load_tokenizer(str(tiny_pair[0]))


@pytest.mark.parametrize("batch_size", [1, 8, 32])
def test_greedy_rows_drafting_from_different_proposers_equal_plain_greedy(models, batch_size: int) -> None:
    target, draft, tokenizer = models
    texts = [f"def f{i}(x):\n    return x + {i}\n\ndef g{i}(x):\n    return" for i in range(12)]
    texts += [f"import os\nimport sys\nprint({i})\n" * 2 for i in range(12)]
    requests = [request(i, tokenizer(t)["input_ids"], 24) for i, t in enumerate(texts)]
    mix = ProposerMix([PromptLookup(), DraftModel(draft)])
    engine = Engine(target, mix, max_rows=batch_size, k_max=4, costs=flat_costs(4))
    results = {done.key: done for done in engine.generate(requests)}
    oracle = Reference(target)
    for one in requests:
        assert results[one.key].token_ids == oracle(one.input_ids, one.max_new_tokens, None), one.key
    used = Counter(name for done in results.values() for name in done.stats.by_proposer)
    assert used["draft"] > 0, used
    if batch_size < 32:  # rows of one batch drafted from either
        assert used["prompt-lookup"] > 0, used


def test_second_tokens_follow_the_target_with_mixed_proposers(peaked_pair) -> None:  # noqa: F811
    """Even rows draft a fixed guess (q one-hot), odd rows from a sampled draft model, in the same
    batches: the second token of every row still follows the target's exact marginal."""
    target, draft, tokenizer = peaked_pair
    ids = tokenizer("def foo(x):")["input_ids"]
    p_target = second_token_distribution(target, ids, 1.0)
    top = p_target.topk(5).indices.tolist()
    even = lambda row: row.request.key % 2 == 0  # noqa: E731
    guess = Fixed("fixed", [top[0], top[1]], offered_to=even)
    mix = ProposerMix([guess, OnlyFor(draft, lambda row: not even(row))])
    engine = Engine(target, mix, max_rows=64, k_max=2, fixed_k=2, costs=flat_costs(2))
    samples = 3000
    rows = [Request(key=s, input_ids=ids, max_new_tokens=3, temperature=1.0, seed=s) for s in range(samples)]
    done = list(engine.generate(rows))
    assert {name for d in done for name in d.stats.by_proposer} == {"fixed", "draft"}
    counts = Counter(d.token_ids[1] for d in done)
    observed = torch.tensor(
        [counts[t] for t in top] + [samples - sum(counts[t] for t in top)], dtype=torch.double
    )
    expected = torch.cat([p_target[top], (1 - p_target[top].sum()).reshape(1)]).double()
    assert engine.stats.accepted > 0 and engine.stats.rejections > 0
    assert chi_square(observed, expected) < CHI2_999[len(top) - 1 if len(top) > 4 else 4]


ROUND_MODULES = [
    "engine", "proposers", "proposer_mix", "draft_model", "suffix_cache", "sampling", "slot_cache", "forward",
]  # fmt: skip


def test_host_values_reach_the_device_through_to_device_in_the_round() -> None:
    """``torch.tensor(host values, device=...)`` copies from pageable memory and waits for every kernel the
    device has queued (a sync mid-round on CUDA); the round's modules use ``forward.to_device`` instead."""
    import ast

    import genjob.generation

    package = Path(genjob.generation.__file__).parent
    found = []
    for name in ROUND_MODULES:
        tree = ast.parse((package / f"{name}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("tensor", "as_tensor")
                and any(keyword.arg == "device" for keyword in node.keywords)
            ):
                found.append(f"{name}.py:{node.lineno}")
    assert found == []


def test_no_proposer_member_is_looked_up_by_name() -> None:
    """The ``Proposer`` protocol holds every member the engine, the mix and the workers use: none is
    asked for with ``getattr``/``hasattr`` (an optional member by name was the implicit contract)."""
    import ast

    import genjob.generation
    import genjob.worker
    from genjob.generation.proposers import Proposer

    members = {name for name in vars(Proposer) if not name.startswith("_")} | set(Proposer.__annotations__)
    assert {"model", "cache", "row_acceptance", "add_output", "advance"} <= members
    found = []
    for package in (genjob.generation, genjob.worker):
        for path in sorted(Path(package.__file__).parent.glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in members
                ):
                    found.append(f"{path.name}:{node.lineno}")
    assert found == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: host syncs are its matter")
def test_a_mode_auto_round_waits_for_the_device_once(models) -> None:
    """Mode auto with rows drafting from different proposers: the round's one host sync is its outcome."""
    import copy

    target, draft, tokenizer = models
    device = torch.device("cuda")
    mix = ProposerMix([PromptLookup(max_ngram=3), DraftModel(copy.deepcopy(draft).to(device))])
    engine = Engine(
        copy.deepcopy(target).to(device), mix, max_rows=4, k_max=4, fixed_k=3, costs=flat_costs(4)
    )
    prompts = ["def f(x): return x + x + x + x", "hello", "def f(x): return x + x + x + x", "world"]
    engine.add(
        Request(key=i, input_ids=tokenizer(text)["input_ids"], max_new_tokens=40)
        for i, text in enumerate(prompts)
    )
    syncs = syncs_in_one_round(engine)
    assert len(syncs) == 1, syncs
