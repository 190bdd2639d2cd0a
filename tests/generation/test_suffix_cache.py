"""The job-wide suffix cache (genjob.generation.suffix_cache): its matches (longest suffix, most frequent
continuation, the probability threshold, the factor × match + offset length rule) against counting by
hand, FIFO eviction by tokens, memory at 10^5 cached tokens, and the ``SuffixLookup`` proposer — its
choice between the row's own candidate and the job's, and a greedy engine run that equals the target's
own greedy decode."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genjob.generation.engine import Engine
from genjob.generation.loading import load_model
from genjob.generation.proposers import BatchView
from genjob.generation.requests import Request, Row, RowStats
from genjob.generation.sampling import RowSampling
from genjob.generation.suffix_cache import SuffixCache, SuffixLookup
from tests.support.engine import Reference, flat_costs, request


def counted(sequences: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    """By hand: how many cached suffixes (each at most ``depth`` tokens) start with each pattern."""
    counts: dict[tuple[int, ...], int] = {}
    for seq in sequences:
        for start in range(len(seq)):
            for end in range(start + 1, min(len(seq), start + depth) + 1):
                key = tuple(seq[start:end])
                counts[key] = counts.get(key, 0) + 1
    return counts


def test_the_longest_suffix_found_drafts_its_most_frequent_continuation() -> None:
    cache = SuffixCache(max_depth=8)
    for seq in ([1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [9, 2, 3, 4, 5], [7, 7, 3, 8]):
        cache.add(seq)
    # "9 2 3" is matched whole (3 tokens): "9 2 3" was followed by 4 5 once
    draft = cache.match([0, 9, 2, 3], 3)
    assert (draft.tokens, draft.probs, draft.match) == ([4, 5], [1.0, 1.0], 3)
    # only "2 3" is found: all 3 suffixes that start with it go on with 4, then 2 of those 3 with 5
    draft = cache.match([5, 2, 3], 2)
    assert (draft.tokens, draft.match) == ([4, 5], 2)
    assert draft.probs == pytest.approx([1.0, 2 / 3])
    assert draft.score(2) == pytest.approx(5 / 3) and draft.score(1) == 1.0
    # "3" alone: 3 of the 4 suffixes that start with it go on with 4, one with 8
    assert cache.match([0, 3], 1).probs == [0.75]
    assert cache.match([42], 4).tokens == [] and cache.match([], 4).tokens == []


def test_the_draft_stops_where_the_estimated_probability_falls_below_the_threshold() -> None:
    cache = SuffixCache(max_depth=12, min_prob=0.3, max_spec_factor=4.0)
    cache.add([1, 2, 3, 10])
    cache.add([1, 2, 3, 11])
    cache.add([1, 2, 3, 12, 20, 21])
    cache.add([1, 2, 3, 12, 20, 22])
    cache.add([1, 2, 3, 12, 20, 22])
    # after "1 2 3": 12 (3/5), then 20 (× 1), then 22 (× 2/3 = 0.4 ≥ 0.3), then the sequences end
    draft = cache.match([1, 2, 3], 8)
    assert draft.tokens == [12, 20, 22]
    assert draft.probs == pytest.approx([0.6, 0.6, 0.4])
    stricter = SuffixCache(max_depth=12, min_prob=0.55, max_spec_factor=4.0)
    for seq in ([1, 2, 3, 12, 20, 21], [1, 2, 3, 12, 20, 22], [1, 2, 3, 12, 20, 22], [1, 2, 3, 10]):
        stricter.add(seq)
    assert stricter.match([1, 2, 3], 8).tokens == [12, 20]  # 3/4, × 1, then 22 at × 2/3 = 0.5 < 0.55
    stricter.add([1, 2, 3, 12, 21])
    stricter.add([1, 2, 3, 11])
    assert stricter.match([1, 2, 3], 8).tokens == [12]  # 4/6, then 20 at × 3/4 = 0.5 < 0.55


def test_the_draft_length_is_factor_times_the_match_plus_offset_and_at_most_k() -> None:
    seq = list(range(100, 140))
    for factor, offset, context, k, expected in [
        (1.0, 0.0, seq[:2], 8, 2),  # a 2-token match drafts 2
        (1.0, 0.0, seq[:5], 8, 5),
        (1.0, 0.0, seq[:10], 8, 8),  # at most k
        (0.5, 1.0, seq[:4], 8, 3),  # 0.5 × 4 + 1
        (2.0, 0.0, [7, *seq[:3]], 8, 6),  # the match is 3 (7 was never seen): 2 × 3
        (0.0, 0.0, seq[:5], 8, 0),
    ]:
        cache = SuffixCache(max_depth=24, max_spec_factor=factor, max_spec_offset=offset)
        cache.add(seq)
        draft = cache.match(context, k)
        at = seq.index(context[-1]) + 1
        assert draft.tokens == seq[at : at + expected], (factor, offset, context, k)
    # the depth bounds the match (to depth − k) so that the draft has room in the trie
    cache = SuffixCache(max_depth=10)
    cache.add(seq)
    draft = cache.match(seq[:20], 4)
    assert draft.match == 6 and draft.tokens == seq[20:24]


@settings(max_examples=60, deadline=None)
@given(
    sequences=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=14), min_size=1, max_size=10),
    contexts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=10), min_size=1, max_size=5),
    depth=st.integers(2, 8),
    limit=st.integers(4, 60),
    k=st.integers(1, 6),
)
def test_matches_agree_with_counting_by_hand(sequences, contexts, depth, limit, k) -> None:
    """Over a 4-token alphabet (many shared paths, splits, ties) with evictions: the match is the
    longest suffix found, each draft token is a most frequent continuation with the estimate
    count(pattern + token) / count(pattern), and the draft stops only where the rules say."""
    cache = SuffixCache(max_depth=depth, max_tokens=limit, min_prob=0.2, max_spec_factor=1.5)
    for seq in sequences:
        cache.add(seq)
    live, total = [], 0
    for seq in reversed([s[-limit:] for s in sequences]):  # what FIFO by tokens keeps
        if total + len(seq) > limit and live:
            break
        live.insert(0, seq)
        total += len(seq)
    assert cache.tokens == total <= limit and cache.sequences == len(live)
    counts = counted(live, depth)
    for context in contexts:
        draft = cache.match(context, k)
        longest = min(len(context), max(depth - k, depth // 2))
        found = [m for m in range(1, longest + 1) if tuple(context[len(context) - m :]) in counts]
        assert draft.match == (max(found) if found else 0)
        pattern, prob = tuple(context[len(context) - draft.match :]), 1.0
        for token, estimate in zip(draft.tokens, draft.probs, strict=True):
            options = {t: counts.get((*pattern, t), 0) for t in range(4)}
            assert options[token] == max(options.values()) > 0
            prob *= options[token] / counts[pattern]
            assert estimate == pytest.approx(prob) and prob >= 0.2
            pattern = (*pattern, token)
        room = min(k, int(1.5 * draft.match + 1e-6))
        if draft.match and len(draft.tokens) < room:  # stopped early: no continuation, or too unlikely
            options = [counts.get((*pattern, t), 0) for t in range(4)]
            assert max(options) == 0 or prob * max(options) / counts[pattern] < 0.2
    # compressed: at most two nodes a suffix, and the same trie as one built from what is left
    fresh = SuffixCache(max_depth=depth, max_tokens=limit)
    for seq in live:
        fresh.add(seq)
    assert cache.node_count() == fresh.node_count() <= 2 * cache.tokens + 1


def test_eviction_is_fifo_by_tokens() -> None:
    cache = SuffixCache(max_depth=6, max_tokens=20)
    cache.add([1, 2, 3, 4, 5, 6])  # the oldest
    cache.add([7, 8, 9, 10])
    cache.add([1, 2, 3, 40, 50])
    assert cache.tokens == 15 and cache.match([1, 2, 3], 3).probs == [0.5, 0.5, 0.5]
    cache.add([11, 12, 13, 14, 15, 16])  # 21 tokens: the oldest goes, its counts with it
    assert cache.tokens == 15 and cache.sequences == 3
    draft = cache.match([1, 2, 3], 3)
    assert (draft.tokens, draft.probs) == ([40, 50], [1.0, 1.0])  # 4 5 6 is gone, 40 50 stays
    assert cache.match([5], 1).tokens == [] and cache.match([14], 2).tokens == [15]
    nodes = cache.node_count()
    for _ in range(50):  # many rounds of adding: the token bound holds, the trie does not grow
        cache.add([7, 8, 9, 10])
        cache.add([1, 2, 3, 40, 50])
        cache.add([11, 12, 13, 14, 15, 16])
        assert cache.tokens <= 20
    assert cache.node_count() == nodes  # the same content, the same trie
    assert cache.match([1, 2, 3], 3).tokens == [40, 50]
    cache.add(list(range(100, 150)))  # longer than the bound: its last 20 tokens, alone
    assert cache.tokens == 20 and cache.sequences == 1
    assert cache.match([8, 9], 1).tokens == [] and cache.match([130, 131], 2).tokens == [132, 133]


def template_outputs(tokens: int, seed: int = 0) -> list[list[int]]:
    """JSON-like outputs of one template: the same keys in the same order, values that vary."""
    rng, outputs, total = random.Random(seed), [], 0
    while total < tokens:
        out = [1]  # {
        for key in range(rng.randint(4, 10)):
            out += [2, 100 + key, 3, 4]  # "key":
            out += [rng.randrange(1_000, 30_000) for _ in range(rng.randint(1, 6))]
            out += [5]  # ,
        out += [6]  # }
        outputs.append(out)
        total += len(out)
    return outputs


def test_memory_at_1e5_cached_tokens_stays_under_64_mib() -> None:
    """Template-like outputs (random tokens, the other extreme, take ≈ 21 MiB: bench/suffix_cache.py)."""
    outputs = template_outputs(100_000)
    tracemalloc.start()
    try:
        cache = SuffixCache()  # the default bound: 10^5 tokens
        for out in outputs:
            cache.add(out)
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cache.tokens > 99_000 and cache.node_count() <= 2 * cache.tokens + 1
    assert current <= 64 * 2**20, f"{current / 2**20:.1f} MiB"


def batch(rows: list[Row]) -> BatchView:
    b = len(rows)
    sampling = RowSampling(torch.zeros(b), torch.ones(b), torch.zeros(b, dtype=torch.long), all_greedy=True)
    pending = torch.tensor([row.tokens[-1] for row in rows])
    return BatchView(rows, pending, sampling, torch.tensor([len(row.tokens) for row in rows]))


def row(prompt: list[int], output: list[int]) -> Row:
    return Row(request=Request(key=0, input_ids=prompt, max_new_tokens=50), stats=RowStats(), tokens=output)


def test_the_proposer_takes_the_better_scored_candidate() -> None:
    job = SuffixCache()
    for _ in range(3):
        job.add([50, 51, 52, 53, 54, 55, 56, 57])
    proposer = SuffixLookup(job)
    rows = [
        row([9, 9, 9], [50, 51, 52]),  # the job's: "50 51 52" goes on with 53 54 55 (score 3 > 0)
        row([1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3]),  # its own: "1 2 3" then 4 5 6 (score 3 > 0)
        row([52, 60, 61], [70, 52]),  # own: "52" → 60 (1 token, match 1); job's: "52" → 53 (1.0): a tie
        row([8], [42]),  # nothing anywhere
        row([50, 51, 99, 98], [0, 50, 51]),  # own: "50 51" → 99 98; job's: "50 51" → 52 53, a tie
    ]
    assert proposer.available(rows, 3) == [3, 3, 1, 0, 2]
    proposal = proposer.propose(batch(rows), 3)
    assert proposal.tokens.shape == (5, 3) and proposal.probs is None
    assert proposal.counts == [3, 3, 1, 0, 2]
    assert proposal.tokens[0].tolist() == [53, 54, 55]
    assert proposal.tokens[1].tolist() == [4, 5, 6]
    assert proposal.tokens[2, :1].tolist() == [53]  # ties go to the job's
    assert proposal.tokens[4, :2].tolist() == [52, 53]
    assert (proposer.chosen_job, proposer.chosen_row, proposer.calls) == (3, 1, 1)
    assert proposer.host_seconds > 0
    proposer.advance(rows, [0] * 5, [0] * 5, 3, [0] * 5)
    rows[1].tokens += [4, 5]  # the row moved on: its candidates are computed afresh
    assert proposer.propose(batch(rows[1:2]), 2).tokens.tolist() == [[6, 7]]
    proposer.advance(rows, [0] * 5, [0] * 5, 2, [0] * 5)
    proposer.add_output([0, 1, 2, 3, 4, 5, 7, 8])  # a row finished: the job's cache learns its output
    proposer.add_output([3, 4, 5, 7, 8])
    assert proposer.add_seconds > 0 and job.sequences == 5
    late = row([5, 30, 31], [0, 1, 2, 3, 4, 5])  # own: "5" → 30 (1.0); job's: "0 … 5" → 7 8 (2.0)
    assert proposer.propose(batch([late]), 2).tokens.tolist() == [[7, 8]]
    assert proposer.chosen_job == 4


def test_greedy_decoding_with_the_suffix_proposer_is_the_targets_own(tiny_pair: tuple[Path, Path]) -> None:
    """Rows whose prompts repeat earlier rows' draft from the job's cache (the caller adds each finished
    row's output, as the worker will) and still decode exactly the target's own greedy tokens."""
    target = load_model(str(tiny_pair[0]))
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 384, (int(n),), generator=gen).tolist() for n in (3, 8, 12, 5)]
    requests = [request(i, prompts[i % 4], 30) for i in range(12)]
    proposer = SuffixLookup()
    engine = Engine(target, proposer, max_rows=4, k_max=4, costs=flat_costs(4))
    results = {}
    for done in engine.generate(requests):
        results[done.key] = done
        proposer.add_output(done.token_ids)
    reference = Reference(target)
    for one in requests:
        assert results[one.key].token_ids == reference(one.input_ids, 30, None)
    assert proposer.chosen_job > 0 and proposer.calls > 0
    repeats = [results[i].stats for i in range(4, 12)]
    assert sum(s.draft_accepted for s in repeats) > sum(results[i].stats.draft_accepted for i in range(4))
