"""The batch size a worker suggests from its measured plain steps (``costs.suggested_batch_size``)."""

from __future__ import annotations

from genjob.generation.costs import CostModel, suggested_batch_size


def plain_steps(seconds: dict[int, float]) -> CostModel:
    batches = sorted(seconds)
    return CostModel(batches, [1], {b: [seconds[b]] for b in batches}, dict.fromkeys(batches, 0.0), 64)


def test_one_noisy_step_does_not_cut_the_batch() -> None:
    """B = 8 measured in a busy moment (gains 1.17x on B = 4): B = 64 still has by far the best tokens/s."""
    steps = {1: 0.033, 2: 0.037, 4: 0.042, 8: 0.073, 16: 0.084, 32: 0.093, 64: 0.129}
    assert suggested_batch_size(plain_steps(steps)) == 64


def test_the_fewest_rows_near_the_best_rate() -> None:
    """Compute-bound from 16 rows on: 32 and 64 rows gain under 10 %, so 16."""
    steps = {1: 0.030, 2: 0.032, 4: 0.036, 8: 0.045, 16: 0.070, 32: 0.135, 64: 0.265}
    assert suggested_batch_size(plain_steps(steps)) == 16
