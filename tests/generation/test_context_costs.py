"""Costs that know the context (issue 42): a round is priced at its rows' real cached length, between the
grid timed at 64 cached tokens and the long grid, and the choice of k follows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from genjob.generation import cost_timing
from genjob.generation.costs import CostModel, choose_draft_length
from genjob.generation.loading import load_model


def two_grids() -> CostModel:
    """A plain step 50 ms at 64 cached tokens and 150 ms at 512 (reading the K/V), while 11 tokens cost
    100 ms more than one at either: at long contexts a long verification is relatively cheap."""
    short = CostModel([1, 8], [1, 11], {1: [0.05, 0.15], 8: [0.05, 0.15]}, {1: 0.0, 8: 0.0}, 64)
    short.long = CostModel([1, 8], [1, 11], {1: [0.15, 0.25], 8: [0.15, 0.25]}, {1: 0.0, 8: 0.0}, 512)
    return short


def test_a_round_is_priced_at_its_rows_cached_length() -> None:
    model = two_grids()
    assert model.verify_seconds(8, 1) == pytest.approx(0.05)  # no length given: the short grid's
    assert model.verify_seconds(8, 1, 64) == pytest.approx(0.05)
    assert model.verify_seconds(8, 1, 512) == pytest.approx(0.15)
    assert model.verify_seconds(8, 11, 288) == pytest.approx((0.15 + 0.25) / 2)
    assert model.verify_seconds(8, 1, 960) == pytest.approx(0.25)  # past the long grid: linear on
    assert model.predicted(8, 10, 512) == pytest.approx(0.25)


def test_noise_that_made_the_long_grid_faster_means_no_growth() -> None:
    model = two_grids()
    assert model.long is not None
    model.long.verify[8] = [0.04, 0.14]
    assert model.verify_seconds(8, 1, 512) == pytest.approx(0.05)


def test_the_draft_length_follows_the_context() -> None:
    """Acceptance 0.6 on every row, a verification 10 ms dearer per token: at 64 cached tokens two drafts
    pay best (1.96 tokens for 1.4 plain steps), at 512 four or five (2.3 tokens for 1.3 plain steps)."""
    model = two_grids()
    acceptance, room = [0.6] * 8, [10] * 8
    short = choose_draft_length(model, acceptance, room, k_max=10, current=0, context=64)
    long = choose_draft_length(model, acceptance, room, k_max=10, current=0, context=512)
    assert (short, long) == (2, 4)


def test_the_long_grid_is_kept_and_merged_with_the_rest() -> None:
    model = two_grids()
    again = CostModel.from_json(model.to_json())
    assert again.long is not None and again.long.context == 512
    assert again.verify_seconds(8, 11, 400) == pytest.approx(model.verify_seconds(8, 11, 400))
    merged = model.merged(two_grids(), weight=1.0)
    assert merged.verify_seconds(8, 11, 400) == pytest.approx(model.verify_seconds(8, 11, 400))
    assert "long" in model.as_dict()


def test_a_measurement_times_both_lengths_within_the_models_context(tiny_pair: tuple[Path, Path]) -> None:
    target = load_model(str(tiny_pair[0]))
    model = cost_timing.quick_prior(target, None, batches=[1, 2], max_query=3)
    assert model.long is not None and model.long.batch_sizes == model.batch_sizes
    # the prior's long grid times the ends of q only (linear between): a cold worker's first job pays less
    assert (model.query_lengths, model.long.query_lengths) == ([1, 2, 3], [1, 3])
    limit = target.config.max_position_embeddings
    assert 2 * model.context <= model.long.context <= min(cost_timing.LONG_CONTEXT, limit - 4)


def test_the_batch_size_probe_times_no_long_grid(tiny_pair: tuple[Path, Path]) -> None:
    """A prior of one-token steps alone (the worker's probe of B = 1 … 64) prices no drafts."""
    target = load_model(str(tiny_pair[0]))
    assert cost_timing.quick_prior(target, None, batches=[1, 2, 4], max_query=1).long is None
