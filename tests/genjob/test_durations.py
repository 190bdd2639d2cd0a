"""Durations for --expire-after."""

from datetime import timedelta

import pytest

from genjob.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("10m", timedelta(minutes=10)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1.5h", timedelta(minutes=90)),
        (" 2H ", timedelta(hours=2)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "10", "10x", "h", "1h 30m", "-5m", "1h-30m"])
def test_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration like 30s, 10m, 2h, 1d or 1h30m"):
        parse_duration(text)


def test_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="is not a positive duration"):
        parse_duration("0s")
