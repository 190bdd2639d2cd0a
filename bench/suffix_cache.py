"""The job-wide suffix cache's costs (genjob.generation.suffix_cache): its memory at 10^5 cached output
tokens (tracemalloc), the time to add outputs, and the host time of a ``propose`` at B = 1, 8 and 64
rows — beside prompt lookup's, on the same rows.

No model: a synthetic extraction job stands in for one. Each row's prompt is fixed instructions and a
schema, then a document with the row's values among filler tokens; its output is JSON-like (the same
keys in the same order, the row's values copied from its document). The cache is filled with 10^5
tokens of such outputs (other rows of the job), then each batch is decoded as a perfect target would:
each round the proposer drafts up to k tokens, the drafts that equal the row's output are accepted and
one more output token is added (greedy verification); a finished row's output goes to the job's cache
and a new row takes its slot. Host µs per round counts ``available`` and ``propose`` (what the engine
calls each round); tokens per round is what the drafts would give with that target, an upper bound
for a real model, which does not follow the template exactly.

    .venv/bin/python bench/suffix_cache.py [--rounds 200] [--k 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import time
import tracemalloc

import torch

from genjob.generation.proposers import BatchView, PromptLookup
from genjob.generation.requests import Request, Row, RowStats
from genjob.generation.sampling import RowSampling
from genjob.generation.suffix_cache import SuffixCache, SuffixLookup

OPEN, CLOSE, QUOTE, COLON, COMMA = 1, 2, 3, 4, 5
INSTRUCTIONS = list(range(200, 260))  # "Extract the following fields as JSON: …"
KEYS = [[1000 + 3 * i, 1001 + 3 * i][: 1 + i % 2] for i in range(10)]  # one or two tokens a key


class Job:
    """Rows of one synthetic extraction template: (prompt, output) pairs."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def row(self) -> tuple[list[int], list[int]]:
        rng = self.rng
        keys = [key for key in KEYS if rng.random() < 0.85]
        values = [[rng.randrange(5_000, 30_000) for _ in range(rng.randint(1, 6))] for _ in keys]
        schema = [t for key in KEYS for t in (QUOTE, *key, QUOTE, COMMA)]
        document = [rng.randrange(30_000, 50_000) for _ in range(120)]
        for value in rng.sample(values, len(values)):
            at = rng.randrange(len(document))
            document[at:at] = value
        output = [OPEN]
        for key, value in zip(keys, values, strict=True):
            output += [QUOTE, *key, QUOTE, COLON, QUOTE, *value, QUOTE, COMMA]
        output[-1] = CLOSE
        return INSTRUCTIONS + schema + document, output

    def outputs(self, tokens: int) -> list[list[int]]:
        out: list[list[int]] = []
        while sum(map(len, out)) < tokens:
            out.append(self.row()[1])
        return out


def cache_costs(outputs: list[list[int]]) -> tuple[float, float, int]:
    """(MiB traced once every output is cached, µs per token added without tracing, cached tokens)."""
    tracemalloc.start()
    cache = SuffixCache()
    for out in outputs:
        cache.add(out)
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    started = time.process_time()
    timed = SuffixCache()
    for out in outputs:
        timed.add(out)
    seconds = time.process_time() - started
    return traced / 2**20, seconds / sum(map(len, outputs)) * 1e6, cache.tokens


def view(rows: list[Row]) -> BatchView:
    b = len(rows)
    sampling = RowSampling(torch.zeros(b), torch.ones(b), torch.zeros(b, dtype=torch.long), all_greedy=True)
    pending = torch.tensor([row.tokens[-1] for row in rows])
    return BatchView(rows, pending, sampling, torch.tensor([len(row.tokens) for row in rows]))


Proposer = PromptLookup | SuffixLookup


def decode(proposer: Proposer, job: Job, b: int, rounds: int, k: int) -> tuple[float, float]:
    """(host µs per round in available + propose, tokens per row-round), ``rounds`` rounds of B rows."""
    truth: dict[int, list[int]] = {}

    def new_row() -> Row:
        prompt, output = job.row()
        row = Row(Request(key=len(truth), input_ids=prompt, max_new_tokens=len(output)), RowStats())
        row.tokens.append(output[0])  # the prefill's token
        truth[id(row)] = output
        return row

    rows = [new_row() for _ in range(b)]
    host = 0.0
    gained = 0
    for _ in range(rounds):
        room = [min(k, row.remaining - 1) for row in rows]
        batch = view(rows)  # the engine builds it anyway
        started = time.process_time()
        counts = proposer.available(rows, k)
        kk = k if any(min(c, r) for c, r in zip(counts, room, strict=True)) else 0
        proposal = proposer.propose(batch, kk) if kk else None
        host += time.process_time() - started
        drafts = proposal.tokens.tolist() if proposal is not None else [[] for _ in rows]
        for slot, row in enumerate(rows):
            output, done = truth[id(row)], len(row.tokens)
            limit = min(room[slot], proposal.counts[slot] if proposal is not None else 0)
            accepted = 0
            while accepted < limit and drafts[slot][accepted] == output[done + accepted]:
                accepted += 1
            row.tokens += output[done : done + accepted + 1]
            gained += accepted + 1
        proposer.advance(rows, [], [], kk, [])
        for slot, row in enumerate(rows):
            if row.remaining <= 0:
                if isinstance(proposer, SuffixLookup):
                    proposer.add_output(row.tokens)
                del truth[id(row)]
                rows[slot] = new_row()
    return host / rounds * 1e6, gained / (rounds * b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    outputs = Job(args.seed).outputs(100_000)
    mib, add_us, cached = cache_costs(outputs)
    rng = random.Random(args.seed)
    noise = [[rng.randrange(50_000) for _ in range(100)] for _ in range(1_000)]
    noise_mib, noise_us, _ = cache_costs(noise)
    print(f"load average {os.getloadavg()[0]:.1f}; k = {args.k}; {args.rounds} rounds per line; CPU times")
    print(f"cache, template outputs: {cached:,} tokens ({len(outputs)} outputs): ", end="")
    print(f"{mib:.1f} MiB, {add_us:.1f} µs a token added")
    print(f"cache, random tokens:    100,000 tokens (1000 outputs): {noise_mib:.1f} MiB, ", end="")
    print(f"{noise_us:.1f} µs a token added\n")
    head = f"{'host µs/round':>13} {'µs/row':>7} {'tokens/round':>12} {'job drafts':>10}"
    print(f"{'B':>3}  {'proposer':<14} {head}")
    for b in (1, 8, 64):
        for name in ("prompt-lookup", "suffix"):
            cache = SuffixCache()
            for out in outputs:
                cache.add(out)
            proposer: Proposer = PromptLookup() if name == "prompt-lookup" else SuffixLookup(cache)
            us, tokens = decode(proposer, Job(args.seed + 1 + b), b, args.rounds, args.k)
            share = ""
            if isinstance(proposer, SuffixLookup):
                chosen = proposer.chosen_job + proposer.chosen_row
                share = f"{proposer.chosen_job / max(1, chosen):.0%}"
            print(f"{b:>3}  {name:<14} {us:>13.0f} {us / b:>7.1f} {tokens:>12.2f} {share:>10}")


if __name__ == "__main__":
    main()
