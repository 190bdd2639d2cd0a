"""Every model a user brings: tiny random models of each family (``tests.support.families``), decoded by
the engine in every mode at batch sizes 1 and 8, rows running past their sliding windows, against
transformers' own greedy ``generate`` at batch 1; sampled tokens of scaled-logit families against the
model's own softmax; ALiBi families refused with one line."""

from __future__ import annotations

import math

import pytest
import torch

from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import Engine
from genjob.generation.forward import UnsupportedModel, attention_layout
from genjob.generation.model_kinds import local_model_refusal
from genjob.generation.proposer_mix import ProposerMix
from genjob.generation.proposers import PromptLookup
from genjob.generation.requests import Request
from genjob.generation.suffix_cache import SuffixCache, SuffixLookup
from tests.support.engine import flat_costs, gap_where_they_differ, greedy, perturbed, request
from tests.support.families import ALIBI_FAMILIES, FAMILIES, VOCAB, WINDOW, family_config, family_model

NEW_TOKENS = 16
NEAR_TIE = 1e-4  # float noise of another batch shape may flip a tie this close, and only that


def prompts(count: int = 8) -> list[list[int]]:
    """Prompts of 16 to 24 tokens that repeat themselves (prompt lookup finds n-grams in them): with
    ``NEW_TOKENS`` every row runs past a window of ``WINDOW``."""
    generator = torch.Generator().manual_seed(3)
    made = []
    for i in range(count):
        base = torch.randint(3, VOCAB, (6 + i % 5,), generator=generator).tolist()
        made.append(base + base[:4] + base)
    return made


def proposer(mode: str, draft):
    if mode == "plain":
        return None
    if mode == "prompt lookup":
        return PromptLookup()
    if mode == "draft":
        return DraftModel(draft)
    return ProposerMix([PromptLookup(), SuffixLookup(SuffixCache()), DraftModel(draft)])  # auto


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_rows_are_transformers_own_in_every_mode(family: str) -> None:
    target = family_model(family)
    draft = perturbed(target, 0.01)  # mostly agrees: rounds verify several tokens
    rows = prompts()
    expected = [greedy(target, ids, NEW_TOKENS, None) for ids in rows]
    assert max(len(ids) for ids in rows) + NEW_TOKENS > 2 * WINDOW
    differing = []
    for mode in ("plain", "prompt lookup", "draft", "auto"):
        for batch in (1, 8):
            engine = Engine(target, proposer(mode, draft), max_rows=batch, k_max=4, costs=flat_costs(4))
            requests = (request(i, ids, NEW_TOKENS) for i, ids in enumerate(rows))
            got = {row.key: row.token_ids for row in engine.generate(requests)}
            for i, ids in enumerate(rows):
                gap = gap_where_they_differ(target, ids, got[i], expected[i])
                if gap is not None:
                    differing.append((mode, batch, i, gap))
    assert all(gap < NEAR_TIE for *_, gap in differing), differing


def test_sliding_windows_are_read_per_layer() -> None:
    assert attention_layout(family_model("mistral_window")).windows == {"all": WINDOW}
    gemma3 = attention_layout(family_model("gemma3"))
    assert gemma3.keyed and gemma3.windows == {"sliding_attention": WINDOW, "full_attention": None}
    assert attention_layout(family_model("llama")).windows == {"all": None}


@pytest.mark.parametrize("family", sorted(ALIBI_FAMILIES))
def test_alibi_models_are_refused_with_one_line(family: str, tmp_path) -> None:
    config = family_config(family)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(UnsupportedModel, match="ALiBi attention is not supported") as refused:
        attention_layout(model)
    assert "\n" not in str(refused.value)
    config.save_pretrained(tmp_path)
    line = local_model_refusal(str(tmp_path))
    assert line is not None and line.startswith(f"cannot decode model {str(tmp_path)!r}: ")
    assert local_model_refusal(str(tmp_path / "absent")) is None


def sampled_z(model, ids: list[int], tokens: list[list[int]], position: int) -> float:
    """How far the model's own probability of the sampled tokens at ``position`` (0: the first new
    token) lies from what sampling from its softmax gives: z of the mean of p(token) against its
    expectation Σp² (sharper sampling than the model's gives z > 0)."""
    observed = expected = variance = 0.0
    with torch.inference_mode():
        for row in tokens:
            logits = model(torch.tensor([ids + row[:position]])).logits[0, -1].double()
            p = torch.softmax(logits, -1)
            observed += float(p[row[position]])
            second = float((p * p).sum())
            expected += second
            variance += float((p**3).sum()) - second**2
    return (observed - expected) / math.sqrt(variance)


@pytest.mark.parametrize("family", ["cohere", "granite", "gemma2"])
def test_sampled_tokens_follow_the_models_own_softmax(family: str) -> None:
    """Cohere's logit_scale, Granite's logits_scaling and Gemma 2's final softcapping apply to the
    first token (the prefill's head) and to later ones (verification) alike. The output layer is
    sharpened so those maps matter: with the head applied past them, the first tokens gave z = +83
    (Cohere) and +21 (Granite)."""
    model = family_model(family)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20)
    ids = prompts(1)[0]
    engine = Engine(model, PromptLookup(), max_rows=16, k_max=2, fixed_k=2, costs=flat_costs(2))
    requests = (
        Request(key=s, input_ids=ids, max_new_tokens=2, temperature=1.0, seed=s + 1) for s in range(200)
    )
    tokens = [row.token_ids for row in engine.generate(requests)]
    assert all(len(row) == 2 for row in tokens)
    for position in (0, 1):
        z = sampled_z(model, ids, tokens, position)
        assert abs(z) < 4, (position, z)
