"""The loop flag of a result (``generation.loops.ends_in_a_loop``)."""

from __future__ import annotations

import pytest

from genjob.generation.loops import LOOP_TOKENS, ends_in_a_loop


@pytest.mark.parametrize(
    ("tokens", "looping"),
    [
        ([7] * LOOP_TOKENS, True),  # one token again and again
        ([1, 2, 3] + [4, 5, 6, 7] * 6, True),  # a cycle of 4, six times
        (list(range(40)) + list(range(10)) * 3, True),  # a cycle of 10, three times: 30 ≥ 24 tokens
        ([7] * (LOOP_TOKENS - 1), False),  # too short to tell
        (list(range(10)) * 2, False),  # a cycle seen twice is no loop
        (list(range(100)), False),
        ([5, 6] * 20 + [9], False),  # it broke out of the loop at the end
    ],
)
def test_a_loop_is_a_short_cycle_repeated_to_the_end(tokens: list[int], looping: bool) -> None:
    assert ends_in_a_loop(tokens) is looping
