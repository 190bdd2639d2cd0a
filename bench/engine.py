"""Engine benchmark: tokens/s of plain, draft, prompt lookup and sampled decoding at B = 1 … 64.

Everything runs in one process on the demo pair, interleaved per batch size (so a noisy machine
shifts every row of a batch size alike): our engine in each mode, transformers' batched plain
``generate`` and, at B = 1, its assisted ``generate`` as references. Each speedup is against plain
decoding at the same batch size (greedy rows against greedy plain, sampled against sampled plain).
Beside it: the expected speedup (Leviathan et al. with the measured verify cost, from the run's α,
its γ histogram and the costs measured at that B) and the limit (the best constant γ for that α).
Outputs are checked: greedy rows must equal plain decoding (the count of differing rows is shown).

    taskset -c 1 .venv/bin/python bench/engine.py            # held-out prompts, 64 new tokens
    taskset -c 1 .venv/bin/python bench/engine.py --long     # the long held-out prompts (200–440 tokens)
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

from genjob.generation.costs import CostModel, expected_speedup, expected_tokens
from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import Engine
from genjob.generation.loading import eos_ids, load_model, load_tokenizer
from genjob.generation.proposers import PromptLookup
from genjob.generation.requests import Request

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"
HELD_OUT = ROOT / "bench" / "prompts" / "heldout.jsonl"


def load_prompts(path: Path, tokenizer, *, n: int, long: bool, room: int) -> list[list[int]]:
    """The first n prompts (of 200+ tokens with ``long``, else under 200) that leave ``room`` tokens."""
    chosen = []
    for line in path.read_text(encoding="utf-8").splitlines():
        ids = tokenizer(json.loads(line)["prompt"])["input_ids"]
        if (len(ids) >= 200) == long and len(ids) + room <= tokenizer.model_max_length:
            chosen.append(ids)
        if len(chosen) == n:
            break
    return chosen


def ours(
    target, proposer, prompts, *, batch: int, new: int, costs: CostModel, temperature: float, eos
) -> dict:
    k_max = 8 if proposer is not None else 0
    engine = Engine(target, proposer, max_rows=batch, k_max=k_max, costs=costs)
    requests = [
        Request(key=i, input_ids=ids, max_new_tokens=new, temperature=temperature, seed=i, eos_ids=eos)
        for i, ids in enumerate(prompts)
    ]
    started = time.perf_counter()
    results = {done.key: done.token_ids for done in engine.generate(requests)}
    seconds = time.perf_counter() - started
    stats = engine.stats
    tokens = sum(len(t) for t in results.values())
    tried = stats.accepted + stats.rejections
    alpha = stats.accepted / tried if tried else None
    mean_batch = stats.rows_sum / max(stats.rounds, 1)
    expected = (
        expected_speedup(costs, alpha, dict(stats.gamma_hist), mean_batch) if alpha is not None else None
    )
    return {
        "seconds": seconds,
        "tokens": tokens,
        "tps": tokens / seconds,
        "outputs": results,
        "alpha": alpha,
        "expected": expected,
        "gamma": dict(sorted(stats.gamma_hist.items())),
        "mean_batch": mean_batch,
    }


def hf_plain(target, prompts, *, batch: int, new: int, pad: int) -> dict:
    """transformers' batched plain greedy generate (left padding), batches of ``batch`` prompts."""
    started, tokens = time.perf_counter(), 0
    for start in range(0, len(prompts), batch):
        group = prompts[start : start + batch]
        width = max(len(ids) for ids in group)
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in group])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in group])
        with torch.inference_mode():
            out = target.generate(
                ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=pad
            )
        tokens += int((out[:, width:] != pad).sum())
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "tokens": tokens, "tps": tokens / seconds}


def hf_assisted(target, draft, prompts, *, new: int, pad: int) -> dict:
    started, tokens = time.perf_counter(), 0
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.inference_mode():
            out = target.generate(
                x,
                attention_mask=torch.ones_like(x),
                assistant_model=draft,
                max_new_tokens=new,
                do_sample=False,
                pad_token_id=pad,
            )
        tokens += out.shape[1] - len(ids)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "tokens": tokens, "tps": tokens / seconds}


def limit(costs: CostModel, alpha: float | None, batch: int, k_max: int = 8) -> float | None:
    """The cost model's best speedup over constant γ for per-token acceptance α at this batch size."""
    if alpha is None:
        return None
    plain = costs.verify_seconds(batch, 1)
    return max(expected_tokens(alpha, k) * plain / costs.predicted(batch, k) for k in range(k_max + 1))


def fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--prompts", type=Path, default=HELD_OUT if HELD_OUT.exists() else ROOT / "examples/prompts.jsonl"
    )
    parser.add_argument("--n", type=int, default=64, help="prompts per run")
    parser.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--long", action="store_true", help="the long prompts (200+ tokens)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = load_model(str(DEMO / "target")), load_model(str(DEMO / "draft"))
    tokenizer = load_tokenizer(str(DEMO / "target"))
    eos = eos_ids(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = load_prompts(args.prompts, tokenizer, n=args.n, long=args.long, room=args.new)
    lengths = [len(p) for p in prompts]
    source = args.prompts.relative_to(ROOT)
    print(
        f"# {len(prompts)} prompts from {source} ({min(lengths)}–{max(lengths)} tokens, median "
        f"{statistics.median(lengths):.0f}), {args.new} new tokens, {args.threads} thread(s), "
        f"torch {torch.__version__}",
        flush=True,
    )
    header = (
        "| B | mode | tok/s | vs plain | expected | limit | α | γ (rounds by k) | rows ≠ plain |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    print(header, flush=True)
    report = []
    for batch in [int(b) for b in args.batches.split(",")]:
        costs = CostModel.measure(target, draft, max_batch=batch, max_query=9)
        runs = {
            "plain": ours(
                target, None, prompts, batch=batch, new=args.new, costs=costs, temperature=0, eos=eos
            ),
            "draft": ours(
                target,
                DraftModel(draft),
                prompts,
                batch=batch,
                new=args.new,
                costs=costs,
                temperature=0,
                eos=eos,
            ),
            "prompt lookup": ours(
                target,
                PromptLookup(),
                prompts,
                batch=batch,
                new=args.new,
                costs=costs,
                temperature=0,
                eos=eos,
            ),
            "plain T=0.7": ours(
                target, None, prompts, batch=batch, new=args.new, costs=costs, temperature=0.7, eos=eos
            ),
            "draft T=0.7": ours(
                target,
                DraftModel(draft),
                prompts,
                batch=batch,
                new=args.new,
                costs=costs,
                temperature=0.7,
                eos=eos,
            ),
            "hf plain generate": hf_plain(target, prompts, batch=batch, new=args.new, pad=pad),
        }
        if batch == 1:
            runs["hf assisted generate"] = hf_assisted(target, draft, prompts, new=args.new, pad=pad)
        greedy_plain, sampled_plain = runs["plain"], runs["plain T=0.7"]
        for mode, run in runs.items():
            base = sampled_plain if "T=0.7" in mode else greedy_plain
            differ = "-"
            if "outputs" in run and "T=0.7" not in mode:
                differ = str(
                    sum(run["outputs"][k] != greedy_plain["outputs"][k] for k in greedy_plain["outputs"])
                )
            row = {
                "batch": batch,
                "mode": mode,
                "tps": run["tps"],
                "speedup": run["tps"] / base["tps"],
                "expected": run.get("expected"),
                "limit": limit(costs, run.get("alpha"), batch),
                "alpha": run.get("alpha"),
                "gamma": run.get("gamma"),
                "differ": differ,
            }
            report.append(row)
            gamma = " ".join(f"{k}:{n}" for k, n in (row["gamma"] or {}).items()) or "-"
            cells = [
                str(batch),
                mode,
                f"{row['tps']:.1f}",
                f"{row['speedup']:.2f}x",
                fmt(row["expected"], "{:.2f}x"),
                fmt(row["limit"], "{:.2f}x"),
                fmt(row["alpha"]),
                gamma,
                differ,
            ]
            print("| " + " | ".join(cells) + " |", flush=True)
        if batch == 8:
            ratio = greedy_plain["tps"] / sampled_plain["tps"]
            print(f"#   B=8: sampled plain takes {ratio:.2f}x the time of greedy plain", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
