"""Lossless check at scale: every greedy output of the engine against transformers' plain greedy decode.

For each held-out prompt (up to the context limit), the oracle is ``generate`` with batch 1 and no
assistant; the engine decodes all prompts at B ∈ {1, 4, 16, 64} with the draft model, with prompt
lookup and in mode auto (prompt lookup, the job's suffix cache fed each finished output, and the draft
model, chosen per row and round; γ chosen by goodput, as a job does). An output may differ from the
oracle only where float noise can flip a near tie: at its first differing position the oracle's two
best logits must be within 1e-4. Every difference is counted and its top-2 gap reported.

    taskset -c 1 .venv/bin/python bench/lossless.py [--n 240] [--new 64]

With ``--model smollm2`` (the real model, no draft: prompt lookup only, and plain decoding on our
engine), the prompts are the held-out chat prompts of every example task (``bench/task_prompts``),
rendered by its chat template:

    taskset -c 1 .venv/bin/python bench/lossless.py --model smollm2 --n 100 --new 32 --batches 1,8,32

With ``--dtype bfloat16`` (or ``float16``: what a GPU job gets) the engine and the oracle run in that dtype,
and each row is also compared with the float32 oracle (the same prompts decoded plainly in float32): how
many rows are identical to each, how many of their tokens agree before the first difference, and the
half-precision oracle's top-2 gap where they first differ (no tie threshold: in half precision the
verification of k + 1 tokens and the batch's size change the kernels' rounding, so a row can leave plain
decoding at a gap far above 1e-4; the table measures how far it drifts, it does not fail):

    nice .venv/bin/python bench/lossless.py --dtype bfloat16 --n 24 --new 64 --batches 1,8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import task_prompts  # bench/task_prompts.py
from repo_root import ROOT

from genjob.catalog import resolve_model
from genjob.generation.cost_timing import measure_grid
from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import Engine
from genjob.generation.forward import max_positions
from genjob.generation.loading import eos_ids, load_model, load_tokenizer
from genjob.generation.proposer_mix import ProposerMix
from genjob.generation.proposers import PromptLookup
from genjob.generation.requests import Request
from genjob.generation.suffix_cache import SuffixCache, SuffixLookup
from genjob.settings import get_settings
from tests.support.engine import gap_where_they_differ, greedy

DEMO = ROOT / "models" / "demo"
HELD_OUT = ROOT / "bench" / "prompts" / "heldout.jsonl"
TIE = 1e-4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--prompts", type=Path, default=HELD_OUT if HELD_OUT.exists() else ROOT / "examples/prompts.jsonl"
    )
    parser.add_argument("--n", type=int, default=240)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--modes", default="draft,prompt lookup,plain,auto", help="those the model has")
    parser.add_argument("--model", default="demo", help="demo (the pair) or a catalog name (smollm2)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    half = args.dtype != "float32"
    if args.model == "demo":
        target, draft = (
            load_model(str(DEMO / "target"), dtype=args.dtype),
            load_model(str(DEMO / "draft"), dtype=args.dtype),
        )
        tokenizer = load_tokenizer(str(DEMO / "target"))
        full = load_model(str(DEMO / "target")) if half else target
    else:
        settings = get_settings()
        location = resolve_model(settings, args.model, allow_paths=True).target
        target = load_model(location, dtype=args.dtype, cache_dir=settings.model_cache_dir)
        full = load_model(location, cache_dir=settings.model_cache_dir) if half else target
        tokenizer, draft = load_tokenizer(location, cache_dir=settings.model_cache_dir), None
    eos = eos_ids(target, tokenizer)
    context = max_positions(target) or 10**9
    prompts = []
    if draft is None:
        per_task = -(-args.n // len(task_prompts.TASKS))
        for task in task_prompts.TASKS:
            for line in task_prompts.chat_lines(task, task_prompts.HELDOUT_PACKAGES, per_task):
                ids = task_prompts.chat_ids(tokenizer, line["body"]["messages"])
                prompts.append((ids, min(args.new, context - len(ids))))
        prompts = prompts[: args.n]
    else:
        for line in args.prompts.read_text(encoding="utf-8").splitlines()[: args.n]:
            ids = tokenizer(json.loads(line)["prompt"])["input_ids"][: context - 1]
            prompts.append((ids, min(args.new, context - len(ids))))  # up to the context, never past it
    started = time.perf_counter()
    expected = [greedy(target, ids, new, eos) for ids, new in prompts]
    in_fp32 = [greedy(full, ids, new, eos) for ids, new in prompts] if half else expected
    longest = max(len(ids) + new for ids, new in prompts)
    source = args.prompts.relative_to(ROOT) if draft is not None else "the example tasks' held-out chat"
    print(
        f"# {len(prompts)} prompts from {source}, up to {args.new} new tokens, longest prompt + output "
        f"{longest} of the context's {context}; {args.dtype}; oracle {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    if half:
        plain_vs_fp32 = sum(a == b for a, b in zip(expected, in_fp32, strict=True))
        print(
            f"# plain {args.dtype} (transformers, B = 1) against plain float32: "
            f"{plain_vs_fp32}/{len(prompts)} identical, "
            f"{agreeing(expected, in_fp32):.0%} of tokens before the first difference",
            flush=True,
        )
        print(
            f"| B | proposer | rows | = plain {args.dtype} | = plain float32 | tokens agreeing with plain "
            f"{args.dtype} | with float32 | top-2 gap where they first differ (median, max) |"
        )
        print("|---|---|---|---|---|---|---|---|")
    else:
        print("| B | proposer | rows | identical | differ at a near tie (≤1e-4) | differ otherwise |")
        print("|---|---|---|---|---|---|")
    failures = 0
    for batch in [int(b) for b in args.batches.split(",")]:
        costs = measure_grid(target, draft, max_batch=batch, max_query=11)
        proposers: dict[str, object] = {"prompt lookup": PromptLookup(), "plain": None}
        if draft is not None:
            proposers = {"draft": DraftModel(draft), "prompt lookup": PromptLookup()}
            if half:  # the engine's own plain rows: how much of the drift is the batch's
                proposers["plain"] = None
        drafting = [DraftModel(draft)] if draft is not None else []
        proposers["auto"] = ProposerMix([PromptLookup(), SuffixLookup(SuffixCache()), *drafting])
        proposers = {name: proposers[name] for name in args.modes.split(",") if name in proposers}
        for name, proposer in proposers.items():
            k_max = 10 if proposer is not None else 0
            engine = Engine(target, proposer, max_rows=batch, k_max=k_max, costs=costs)
            requests = [
                Request(key=i, input_ids=ids, max_new_tokens=new, eos_ids=eos)
                for i, (ids, new) in enumerate(prompts)
            ]
            got = {}
            for done in engine.generate(requests):
                got[done.key] = done.token_ids
                if isinstance(proposer, ProposerMix):  # the job's suffix cache learns each output
                    proposer.add_output(done.token_ids)
            rows = [got[i] for i in range(len(prompts))]
            if half:
                gaps = [
                    gap
                    for (ids, _), row, oracle in zip(prompts, rows, expected, strict=True)
                    if (gap := gap_where_they_differ(target, ids, row, oracle)) is not None
                ]
                same = sum(a == b for a, b in zip(rows, expected, strict=True))
                same_fp32 = sum(a == b for a, b in zip(rows, in_fp32, strict=True))
                spread = f"{statistics.median(gaps):.2g}, {max(gaps):.2g}" if gaps else "–"
                print(
                    f"| {batch} | {name} | {len(prompts)} | {same} | {same_fp32} | "
                    f"{agreeing(rows, expected):.0%} | {agreeing(rows, in_fp32):.0%} | {spread} |",
                    flush=True,
                )
                continue
            ties, other, gaps = 0, 0, []
            for i, (ids, _) in enumerate(prompts):
                gap = gap_where_they_differ(target, ids, got[i], expected[i])
                if gap is None:
                    continue
                gaps.append(gap)
                if gap <= TIE:
                    ties += 1
                else:
                    other += 1
            failures += other
            same = len(prompts) - ties - other
            detail = f" (gaps {', '.join(f'{g:.1e}' for g in gaps)})" if gaps else ""
            print(f"| {batch} | {name} | {len(prompts)} | {same} | {ties} | {other}{detail} |", flush=True)
    return 1 if failures else 0


def agreeing(rows: list[list[int]], oracles: list[list[int]]) -> float:
    """The share of the oracles' tokens that the rows repeat before their first difference."""
    kept = 0
    for row, oracle in zip(rows, oracles, strict=True):
        kept += next(
            (j for j, (a, b) in enumerate(zip(row, oracle, strict=False)) if a != b),
            min(len(row), len(oracle)),
        )
    return kept / max(1, sum(len(oracle) for oracle in oracles))


if __name__ == "__main__":
    sys.exit(main())
