"""What a verification costs by the model a worker keeps (``CostModel``), when some batch rows were
measured only for plain steps, and the engine's exploration rounds beside its probe rounds."""

from __future__ import annotations

import pytest

from genjob.generation.costs import CostModel
from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import EXPLORE_EVERY, Engine
from tests.support.engine import perturbed, request
from tests.support.models import build_model, build_tokenizer


def grid_with_plain_only_rows() -> CostModel:
    """B = 1 and 16 measured up to q = 11; B = 2, 4, 8 only at q = 1 (the worker's batch-size probe)."""
    verify = {1: [0.030, 0.033, 0.050], 16: [0.080, 0.100, 0.200]}
    for b, plain in ((2, 0.035), (4, 0.045), (8, 0.060)):
        verify[b] = [plain, 0.0, 0.0]  # never read past q = 1
    reach = {1: 11, 2: 1, 4: 1, 8: 1, 16: 11}
    return CostModel([1, 2, 4, 8, 16], [1, 2, 11], verify, dict.fromkeys(verify, 0.0), 64, row_query=reach)


def test_a_row_measured_only_plain_gives_its_plain_step_and_borrows_the_growth_in_q() -> None:
    model = grid_with_plain_only_rows()
    assert model.verify_seconds(8, 1) == pytest.approx(0.060)
    # q = 2 costs 1.1x a plain step at B = 1 and 1.25x at B = 16: at B = 8, in between, times its plain step
    growth = 1.1 + (1.25 - 1.1) * (8 - 1) / (16 - 1)
    assert model.verify_seconds(8, 2) == pytest.approx(0.060 * growth)
    assert model.verify_seconds(16, 11) == pytest.approx(0.200)
    held = model.verify_seconds(64, 1) * 2.5  # past the last row, its growth in q holds
    assert model.verify_seconds(64, 11) == pytest.approx(held)


def test_merging_a_measured_prior_into_plain_only_rows_keeps_its_q_values() -> None:
    """The kept grid has B = 8 only at q = 1; a job's prior then measures B = 8 up to q = 11. The merged
    row's q > 1 values are the prior's, not a mean with the kept row's extrapolation (q × plain)."""
    kept = CostModel([8], [1], {8: [0.060]}, {8: 0.0}, 64, row_query={8: 1})
    prior = CostModel([8], [1, 2, 11], {8: [0.064, 0.070, 0.120]}, {8: 0.0}, 64)
    merged = kept.merged(prior, weight=1.0)
    assert merged.verify[8] == pytest.approx([0.062, 0.070, 0.120])
    assert merged.row_query[8] == 11


@pytest.mark.parametrize("probe_every", [0, 4, 16])
def test_rounds_that_choose_plain_still_explore_beside_probe_rounds(probe_every: int) -> None:
    """Drafts priced dearer than they save: the rounds are plain, but every EXPLORE_EVERY-th plain choice
    tries k = 1, also when a probe falls on every 4th or 16th round (it used to shadow them all)."""
    tokenizer = build_tokenizer()
    target = build_model(tokenizer, n_layer=1, n_embd=32, seed=3)
    costs = CostModel([1], [1, 2], {1: [1.0, 3.0]}, {1: 1.0}, context=64)
    engine = Engine(
        target, DraftModel(perturbed(target, 0.01)), max_rows=1, k_max=1, costs=costs, probe_every=probe_every
    )
    list(engine.generate([request(0, tokenizer("def f(x):")["input_ids"], 6 * EXPLORE_EVERY)]))
    hist = engine.stats.gamma_hist
    assert hist.get(1, 0) >= 3, hist
    assert hist.get(1, 0) <= sum(hist.values()) // 8, hist
