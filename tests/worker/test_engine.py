"""The engine is lossless under greedy decoding and its stats add up, on tiny random pairs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from genjob.constants import DecodingMode, DraftSchedule
from genjob.generation.engine import DecodeOptions, Engine
from genjob.generation.loading import load_model, load_tokenizer

PROMPTS = [
    "def foo(x):\n    return",
    "import os\n",
    "class Parser:\n    def __init__(self):",
    "for i in range(10):",
    "x",
]


@pytest.fixture(scope="module")
def models(tiny_pair: tuple[Path, Path]):
    target, draft = tiny_pair
    return load_model(str(target)), load_model(str(draft)), load_tokenizer(str(target))


@pytest.mark.parametrize("mode", [DecodingMode.DRAFT, DecodingMode.PROMPT_LOOKUP])
@pytest.mark.parametrize("schedule", list(DraftSchedule))
@pytest.mark.parametrize("max_new_tokens", [1, 7, 40])
def test_assisted_greedy_equals_plain_greedy(models, mode, schedule, max_new_tokens) -> None:
    target, draft, tokenizer = models
    engine = Engine(target, assistant=draft, mode=mode, draft_tokens=4, schedule=schedule)
    options = DecodeOptions(max_new_tokens=max_new_tokens)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        assisted = engine.generate(ids, options)
        plain = engine.generate(ids, options, mode=DecodingMode.NONE)
        assert assisted.token_ids == plain.token_ids, prompt
        stats = assisted.stats
        assert stats.new_tokens == len(assisted.token_ids) <= max_new_tokens
        assert 0 <= stats.draft_accepted <= stats.draft_proposed
        assert stats.target_rounds + stats.draft_accepted == stats.new_tokens
        assert plain.stats.target_rounds == plain.stats.new_tokens
        assert plain.stats.draft_proposed == plain.stats.draft_accepted == 0


def test_draft_that_is_the_target_accepts_everything(models) -> None:
    target, _, tokenizer = models
    twin = copy.deepcopy(target)  # a separate module, so the target's round counter sees only itself
    engine = Engine(target, assistant=twin, draft_tokens=4, schedule=DraftSchedule.CONSTANT)
    decoded = engine.generate(tokenizer("def foo(x):")["input_ids"], DecodeOptions(max_new_tokens=30))
    stats = decoded.stats
    assert stats.draft_accepted == stats.draft_proposed > 0
    assert stats.target_rounds < stats.new_tokens / 3


def test_heuristic_draft_length_is_carried_by_the_engine_not_the_model(models) -> None:
    target, draft, tokenizer = models
    engine = Engine(target, assistant=draft, draft_tokens=6, schedule=DraftSchedule.HEURISTIC)
    engine.generate(tokenizer("import os")["input_ids"], DecodeOptions(max_new_tokens=20))
    learned = engine.draft_tokens
    assert learned < 6  # random pair: rounds are rejected, γ shrinks
    other = Engine(target, assistant=draft, draft_tokens=6, schedule=DraftSchedule.HEURISTIC)
    assert other.draft_tokens == 6
    with torch.no_grad():
        engine.generate(tokenizer("x")["input_ids"], DecodeOptions(max_new_tokens=5))
    assert engine.draft_tokens <= learned


DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"


@pytest.mark.skipif(not (DEMO / "target" / "config.json").exists(), reason="demo pair not present")
@pytest.mark.parametrize("mode", [DecodingMode.DRAFT, DecodingMode.PROMPT_LOOKUP])
def test_demo_pair_is_lossless(mode) -> None:
    """The trained demo pair, on held-out prompts: assisted output == plain greedy output."""
    import json

    target, draft = load_model(str(DEMO / "target")), load_model(str(DEMO / "draft"))
    tokenizer = load_tokenizer(str(DEMO / "target"))
    engine = Engine(target, assistant=draft, mode=mode, draft_tokens=5)
    lines = (Path(__file__).resolve().parents[2] / "examples" / "prompts.jsonl").read_text().splitlines()
    for line, max_new_tokens in zip(lines[:4], (8, 24, 40, 17), strict=True):
        ids = tokenizer(json.loads(line)["prompt"])["input_ids"]
        options = DecodeOptions(max_new_tokens=max_new_tokens)
        assisted = engine.generate(ids, options)
        assert assisted.token_ids == engine.generate(ids, options, mode=DecodingMode.NONE).token_ids
        assert assisted.stats.target_rounds + assisted.stats.draft_accepted == assisted.stats.new_tokens
