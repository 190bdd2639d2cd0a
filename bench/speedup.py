"""Plain vs assisted decoding (draft model, prompt lookup) on the same prompts, in one process.

Prints one row per mode: acceptance rate α, cost ratio c, the expected speedup of Leviathan et al.
(1 − α^(γ+1)) / ((1 − α)(γc + 1)) with γ the mean number of tokens proposed per round and α the i.i.d.
acceptance probability that explains the observed tokens per round (as `genjob stats` does), the measured
speedup (plain time / mode time over the same prompts), tokens/s and the lossless rate (greedy outputs
equal to plain greedy). Runs are interleaved per prompt (plain, then each mode) so that machine noise
hits every mode alike.

    .venv/bin/python bench/speedup.py --target models/demo/target --draft models/demo/draft
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from genjob.constants import DecodingMode, DraftSchedule
from genjob.generation.costs import cost_ratio
from genjob.generation.engine import DecodeOptions, Engine
from genjob.generation.loading import load_model, load_tokenizer
from genjob.stats import expected_speedup, iid_acceptance

log = logging.getLogger("bench.speedup")


@dataclass
class ModeTotals:
    seconds: float = 0.0
    new_tokens: int = 0
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    matches: int = 0
    runs: int = 0
    outputs: list[list[int]] = field(default_factory=list)


def read_prompts(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as stream:
        return [json.loads(line)["prompt"] for line in stream if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="models/demo/target")
    parser.add_argument("--draft", default="models/demo/draft")
    parser.add_argument("--prompts", type=Path, default=Path("examples/prompts.jsonl"))
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--draft-tokens", type=int, nargs="+", default=[3, 5, 8])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)

    tokenizer = load_tokenizer(args.target)
    target, draft = load_model(args.target), load_model(args.draft)
    prompts = [tokenizer(p)["input_ids"] for p in read_prompts(args.prompts)]
    c = cost_ratio(target, draft, prompts[0])

    # name → (engine, its cost ratio c)
    engines: dict[str, tuple[Engine, float]] = {"plain": (Engine(target, mode=DecodingMode.NONE), 0.0)}
    for gamma in args.draft_tokens:
        engines[f"draft γ={gamma} constant"] = (
            Engine(target, assistant=draft, draft_tokens=gamma, schedule=DraftSchedule.CONSTANT),
            c,
        )
    engines["draft heuristic"] = (Engine(target, assistant=draft, draft_tokens=5), c)
    engines["prompt lookup"] = (Engine(target, mode=DecodingMode.PROMPT_LOOKUP), 0.0)

    options = DecodeOptions(max_new_tokens=args.max_new_tokens)
    for engine, _ in engines.values():  # warm-up
        engine.generate(prompts[0], DecodeOptions(max_new_tokens=8))
    totals = {name: ModeTotals() for name in engines}
    for repeat in range(args.repeats):
        for index, ids in enumerate(prompts):
            plain_ids = None
            for name, (engine, _) in engines.items():
                decoded = engine.generate(ids, options)
                t = totals[name]
                t.seconds += decoded.stats.latency_s
                t.new_tokens += decoded.stats.new_tokens
                t.rounds += decoded.stats.target_rounds
                t.proposed += decoded.stats.draft_proposed
                t.accepted += decoded.stats.draft_accepted
                t.runs += 1
                if name == "plain":
                    plain_ids = decoded.token_ids
                t.matches += int(decoded.token_ids == plain_ids)
            log.info("repeat %d prompt %d/%d done", repeat + 1, index + 1, len(prompts))

    plain = totals["plain"]
    print(
        f"\ntarget {args.target}, draft {args.draft}: {len(prompts)} prompts x {args.repeats}, "
        f"max_new_tokens {args.max_new_tokens}, torch threads {torch.get_num_threads()}"
    )
    print(f"cost ratio c (draft / target, 1-token cached forward) = {c:.3f}\n")
    header = f"| {'mode':<22} | α     | γ̄    | tok/round | expected | measured | tokens/s | lossless |"
    print(header)
    print("|" + "|".join("-" * (len(part)) for part in header.split("|")[1:-1]) + "|")
    for name, t in totals.items():
        ratio = engines[name][1]
        alpha = t.accepted / t.proposed if t.proposed else None
        gamma = t.proposed / t.rounds if t.rounds else 0
        tokens_per_round = t.new_tokens / t.rounds
        expected = 1.0
        if alpha is not None:  # Leviathan's i.i.d. α that explains the observed tokens per round
            g = max(1, round(gamma))
            expected = expected_speedup(iid_acceptance(tokens_per_round, g), g, ratio)
        print(
            f"| {name:<22} | {'-' if alpha is None else f'{alpha:.3f}':<5} | {gamma:4.1f} | "
            f"{t.new_tokens / t.rounds:9.2f} | {expected:7.2f}x | {plain.seconds / t.seconds:7.2f}x | "
            f"{t.new_tokens / t.seconds:8.1f} | {t.matches / t.runs:7.0%} |"
        )


if __name__ == "__main__":
    main()
