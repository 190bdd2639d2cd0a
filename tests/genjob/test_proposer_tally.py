"""A proposer's tally and its stored form: flat ``name:field`` keys, the shape existing databases hold."""

from __future__ import annotations

from genjob.proposer_tally import ProposerTally, tallies_from_json, tallies_to_json


def test_a_round_counts_into_every_field() -> None:
    tally = ProposerTally()
    tally.count_round(proposed=4, accepted=2, refused=True)
    tally.count_round(proposed=3, accepted=3, refused=False)
    assert tally == ProposerTally(rounds=2, proposed=7, accepted=5, rejections=1)


def test_stored_as_flat_keys_and_read_back() -> None:
    tallies = {"draft": ProposerTally(3, 12, 7, 2), "prompt-lookup": ProposerTally(1, 4, 4, 0)}
    stored = tallies_to_json(tallies)
    assert stored == {
        "draft:rounds": 3,
        "draft:proposed": 12,
        "draft:accepted": 7,
        "draft:rejections": 2,
        "prompt-lookup:rounds": 1,
        "prompt-lookup:proposed": 4,
        "prompt-lookup:accepted": 4,
        "prompt-lookup:rejections": 0,
    }
    assert tallies_from_json(stored) == tallies
    assert tallies_from_json(None) == {} == tallies_from_json({})


def test_a_missing_field_counts_zero_and_an_unknown_one_is_passed_over() -> None:
    assert tallies_from_json({"a:b:rounds": 2, "a:b:later": 9}) == {"a:b": ProposerTally(rounds=2)}
