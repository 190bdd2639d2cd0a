"""The fast path for genjob lines gives the checked parse's result, or steps aside (None).

``parse_genjob_json`` may refuse a line the checked parse accepts (it is only slower then), never
accept one that the checked parse refuses or reads differently: duplicate keys above all, which
pydantic-core's JSON parser accepts (the last wins) and the checked parse refuses.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from genjob.formats.genjob_lines import parse_genjob_json, parse_genjob_line
from genjob.formats.lines import LineProblem, ParsedLine, parse_json_line


def checked(raw: bytes) -> ParsedLine | None:
    """The checked parse's reading of a line, None if it refuses it."""
    try:
        data = parse_json_line(raw.decode("utf-8").rstrip("\r\n"), last_line=False)
        return parse_genjob_line(data) if isinstance(data, dict) else None
    except (LineProblem, UnicodeDecodeError):
        return None


def assert_agrees(raw: bytes) -> ParsedLine | None:
    fast = parse_genjob_json(raw)
    if fast is not None:
        assert fast == checked(raw), raw
    return fast


TRICKY = [
    b'{"prompt": "a", "prompt": "b"}',
    b'{"prompt": "a:b", "prompt": "c"}',
    b'{"prompt": "a", "id": "x", "id": "y"}',
    b'{"prompt": "a", "max_new_tokens": 5, "max_new_tokens": 6}',
    b'{"prompt": "a", "pr\\u006fmpt": "b"}',
    b'{"prompt": "x\\u003a", "prompt": "y"}',
    b'{"prompt": "a:\\u003Ab", "id": "c", "id": "d"}',
    b'{"prompt": "a\\":", "prompt": "b"}',
    b'{"prompt": "a\\\\", "prompt": "b:"}',
    b'{"prompt": "a", "max_new_tokens": 1.0}',
    b'{"prompt": "a", "max_new_tokens": 1e2}',
    b'{"prompt": "a", "max_new_tokens": NaN}',
    b'{"prompt": "a", "max_new_tokens": ' + b"9" * 5000 + b"}",
    b'{"prompt": "\\ud800"}',
    b'{"prompt": "\xff"}',
    b'{"prompt": "\xed\xa0\x80"}',
    b'{"prompt": "a\x01"}',
    b'{"prompt": [' * 100 + b"]" * 100 + b"}",
    b'\x0c{"prompt": "a"}',
    b'{"prompt": "a"} x',
    b'{"prompt": "a",}',
    b'{"prompt": " "}',
    b'{"prompt": "\\u001c"}',
    b'{"prompt": "a", "id": ""}',
    b'{"prompt": "a", "extra": 1}',
    b"[]",
    b"",
]


def test_tricky_lines_agree() -> None:
    for raw in TRICKY:
        assert_agrees(raw)


def test_a_duplicate_key_is_never_taken_by_the_fast_path() -> None:
    for raw in TRICKY[:9]:
        assert parse_genjob_json(raw) is None, raw


def test_plain_lines_take_the_fast_path() -> None:
    lines = [
        b'{"prompt": "Summarise ticket 7: it stalls at step 3."}\n',
        b'{"prompt": "a\\nb", "id": "t:1", "max_new_tokens": 12}\r\n',
        b'{"id": null, "prompt": "\\u00e9t\\u00e9 \xf0\x9f\x98\x80"}',
    ]
    for raw in lines:
        assert assert_agrees(raw) is not None, raw


KEYS = st.sampled_from(["prompt", "id", "max_new_tokens", "pr\\u006fmpt", "i\\u0064", "other"])
PIECES = st.sampled_from([*'ab :"\\é\x00\x1c', "\\u003a", "\\\\", "\\u0070"])
TEXT = st.lists(PIECES, max_size=6).map("".join)
VALUES = st.one_of(
    TEXT.map(json.dumps),
    TEXT.map(lambda text: f'"{text}"'),  # raw, possibly invalid escapes
    st.integers(-3, 10**6).map(str),
    st.sampled_from(["null", "1.5", "true", "[]", "{}", "NaN"]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(KEYS, VALUES, st.sampled_from(["", " ", "\t"])), max_size=4))
def test_generated_lines_agree(pairs: list[tuple[str, str, str]]) -> None:
    members = ",".join(f'{space}"{key}"{space}:{space}{value}' for key, value, space in pairs)
    assert_agrees(("{" + members + "}").encode())
