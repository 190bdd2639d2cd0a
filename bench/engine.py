"""Engine benchmark: tokens/s of plain, draft, prompt lookup, auto and sampled decoding at B = 1 … 64.

Everything runs in one process on the demo pair, interleaved per batch size (so a noisy machine
shifts every row of a batch size alike): our engine in each mode, transformers' batched plain
``generate`` and, at B = 1, its assisted ``generate`` as references. Each speedup is against plain
decoding at the same batch size (greedy rows against greedy plain, sampled against sampled plain).
Beside it: the expected speedup (Leviathan et al. with the measured verify cost, from the run's α,
its γ histogram and the costs measured at that B) and the limit (the best constant γ for that α).
Outputs are checked: greedy rows must equal plain decoding (the count of differing rows is shown).
Each batch size's prompts go in groups of ``--group`` × B (4 by default; one prompt at B = 1), and
every mode decodes a group before the next group starts (wall time, one thread pinned to one core),
so a slow spell of a shared machine lands on every mode alike and the ratios hold. Within a group a
free slot takes the next prompt at once, as a worker refills its batch: speculative rows gain tokens
at different rates and leave at different rounds, so groups of exactly B would leave slots empty
while the group's slowest row finishes (plain rows, all of one length, leave together) and
undercount speculation. Each engine has its own copy of the measured costs (its live scale is its
own), prompt lookup's without the draft model's steps, as a worker measures them for that job.

    taskset -c 1 .venv/bin/python bench/engine.py            # held-out prompts, 64 new tokens
    taskset -c 1 .venv/bin/python bench/engine.py --long     # the long held-out prompts (200–440 tokens)
    taskset -c 1 .venv/bin/python bench/engine.py --modes draft,auto --batches 1,8   # mode auto, a draft

Mode auto is prompt lookup, the job's suffix cache (fed each finished row's output, timed with the rest)
and the draft model, chosen per row and per round (``genjob.generation.proposer_mix``).
    taskset -c 1 .venv/bin/python bench/engine.py --clock cpu  # CPU time: a loaded shared machine
    .venv/bin/python bench/engine.py --device cuda --dtype bfloat16 --batches 1,8,64   # a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from genjob.generation.cost_timing import measure_grid
from genjob.generation.costs import CostModel, expected_speedup, expected_tokens
from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import Engine
from genjob.generation.loading import eos_ids, load_model, load_tokenizer
from genjob.generation.proposer_mix import ProposerMix
from genjob.generation.proposers import NgramIndex, PromptLookup
from genjob.generation.requests import Request
from genjob.generation.suffix_cache import SuffixCache, SuffixLookup

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"
HELD_OUT = ROOT / "bench" / "prompts" / "heldout.jsonl"
# What a mode's seconds are: wall time, or with --clock cpu this process's CPU time (one torch thread:
# the time the mode computed, without the time it waited for a core a shared machine gave others).
CLOCK = time.perf_counter


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


class Tally:
    """One mode's sums over the groups of a batch size: seconds, tokens, outputs and engine stats."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.tokens = 0
        self.outputs: dict[int, list[int]] = {}
        self.accepted = self.rejections = self.rounds = self.rows_sum = 0
        self.gamma: Counter[int] = Counter()
        self.drafts: Counter[int] = Counter()  # row-rounds by the drafts the row had
        self.engine = False

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds

    @property
    def alpha(self) -> float | None:
        tried = self.accepted + self.rejections
        return self.accepted / tried if tried else None

    def expected(self, costs: CostModel) -> float | None:
        if self.alpha is None:
            return None
        batch = self.rows_sum / max(self.rounds, 1)
        return expected_speedup(costs, self.alpha, dict(self.gamma), batch, dict(self.drafts))


def ours(tally: Tally, engine: Engine, group, *, new: int, temperature: float, eos, learn=None) -> None:
    """Decode one group of (key, prompt) on ``engine`` (kept across groups, as a worker keeps it
    across chunks); add its time, tokens and outputs to ``tally``. ``learn(tokens)``: each finished
    row's output, timed with the rest (mode auto's suffix cache, as a worker feeds it)."""
    requests = [
        Request(key=key, input_ids=ids, max_new_tokens=new, temperature=temperature, seed=key, eos_ids=eos)
        for key, ids in group
    ]
    started = CLOCK()
    results = {}
    for done in engine.generate(requests):
        results[done.key] = done.token_ids
        if learn is not None:
            learn(done.token_ids)
    tally.seconds += CLOCK() - started
    tally.tokens += sum(len(t) for t in results.values())
    tally.outputs.update(results)


def absorb(tally: Tally, engine: Engine) -> None:
    """The engine's statistics over every group it decoded."""
    stats = engine.stats
    tally.accepted, tally.rejections = stats.accepted, stats.rejections
    tally.rounds, tally.rows_sum = stats.rounds, stats.rows_sum
    tally.gamma.update(stats.gamma_hist)
    tally.drafts.update(stats.drafts_hist)
    tally.engine = True


def hf_plain(tally: Tally, target, group, *, new: int, pad: int) -> None:
    """transformers' batched plain greedy generate of one group (left padding)."""
    prompts = [ids for _, ids in group]
    width = max(len(ids) for ids in prompts)
    ids = torch.tensor([[pad] * (width - len(x)) + x for x in prompts])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts])
    started = CLOCK()
    with torch.inference_mode():
        out = target.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=pad)
    tally.seconds += CLOCK() - started
    tally.tokens += int((out[:, width:] != pad).sum())


def hf_generate(tally: Tally, target, group, *, new: int, pad: int, **options) -> None:
    """transformers' greedy generate with ``options`` (an assistant model, prompt lookup), one prompt
    at a time (assisted generation refuses batches); time, tokens and outputs into ``tally``."""
    for key, ids in group:
        x = torch.tensor([ids])
        started = CLOCK()
        with torch.inference_mode():
            out = target.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=new,
                do_sample=False,
                pad_token_id=pad,
                **options,
            )
        tally.seconds += CLOCK() - started
        tokens = out[0, len(ids) :].tolist()
        tally.tokens += len(tokens)
        tally.outputs[key] = tokens


def limit(costs: CostModel, alpha: float | None, batch: int, k_max: int = 8) -> float | None:
    """The cost model's best speedup over constant γ for per-token acceptance α at this batch size."""
    if alpha is None:
        return None
    plain = costs.verify_seconds(batch, 1)
    return max(expected_tokens(alpha, k) * plain / costs.predicted(batch, k) for k in range(k_max + 1))


def lookup_limit(
    costs: CostModel, greedy: list[tuple[list[int], list[int]]], batch: int, k_max: int = 8
) -> float | None:
    """Prompt lookup's limit: its best constant k when each row, at each position of its greedy output
    (prompt, output), drafts min(k, what its own n-grams offer there), a round of k' drafts costing
    this batch size's round with k' drafts shared by B rows. A position with no earlier match gets no
    draft, so α alone (as in ``limit``) overstates what prompt lookup can reach."""
    if not greedy:
        return None
    plain = sum(len(out) for _, out in greedy) * costs.verify_seconds(batch, 1)
    best = 1.0
    for k in range(1, k_max + 1):
        spent = 0.0
        for prompt, out in greedy:
            index, t = NgramIndex(3), 0
            while t < len(out):
                guess = index.lookup(prompt + out[:t], min(k, len(out) - t - 1))
                run = next(
                    (i for i, (g, o) in enumerate(zip(guess, out[t:], strict=False)) if g != o), len(guess)
                )
                spent += costs.predicted(batch, len(guess))
                t += run + 1
        best = max(best, plain / spent)
    return best


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
    parser.add_argument("--temperature", type=float, default=0.7, help="of the sampled rows")
    parser.add_argument("--group", type=int, default=4, help="prompts per group, in batches (B each)")
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall", help="cpu: this process's CPU time"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--modes", default="", help="only these (and plain), comma-separated; default all")
    parser.add_argument("--device", default="cpu", help="torch device (cuda on a GPU machine)")
    parser.add_argument("--dtype", default="auto", help="auto: float32 on CPU, bfloat16 on a GPU")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    target = load_model(str(DEMO / "target"), args.device, args.dtype)
    draft = load_model(str(DEMO / "draft"), args.device, args.dtype)
    tokenizer = load_tokenizer(str(DEMO / "target"))
    eos = eos_ids(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = load_prompts(args.prompts, tokenizer, n=args.n, long=args.long, room=args.new)
    lengths = [len(p) for p in prompts]
    source = args.prompts.relative_to(ROOT)
    print(
        f"# {len(prompts)} prompts from {source} ({min(lengths)}–{max(lengths)} tokens, median "
        f"{statistics.median(lengths):.0f}), {args.new} new tokens, {args.threads} thread(s), {args.clock} "
        f"clock, "
        f"torch {torch.__version__}",
        flush=True,
    )
    header = (
        "| B | mode | tok/s | vs plain | expected | limit | α | γ (rounds by k) | rows ≠ plain |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    print(header, flush=True)
    t = args.temperature
    sampled = f"T={t:g}"
    report: list[dict] = []
    for batch in [int(b) for b in args.batches.split(",")]:
        costs = measure_grid(target, draft, max_batch=batch, max_query=9)
        # Groups of --group × B prompts; every mode decodes a group before the next group starts, so
        # a slow spell of the machine lands on every mode alike. Prompts repeat until there are 2+ groups.
        size = args.group * batch if batch > 1 else 1  # a single row has no tail: the finest interleaving
        repeats = max(1, -(-2 * size // len(prompts)))
        keyed = [(r * len(prompts) + i, ids) for r in range(repeats) for i, ids in enumerate(prompts)]
        prompt_of = dict(keyed)
        groups = [keyed[i : i + size] for i in range(0, len(keyed), size)]
        modes = [
            "plain",
            "draft",
            "prompt lookup",
            "auto",
            f"plain {sampled}",
            f"draft {sampled}",
            "hf plain generate",
        ]
        if batch == 1:
            modes.append("hf assisted generate")
        if args.modes:  # plain stays: it is every greedy mode's baseline (and the sampled one's, sampled)
            wanted = {"plain", *args.modes.split(",")}
            modes = [m for m in modes if m in wanted or (sampled in m and f"draft {sampled}" in wanted)]
        runs = {mode: Tally() for mode in modes}
        job_outputs = SuffixLookup(SuffixCache())  # mode auto: lookup, the job's outputs, the draft
        proposers = {
            "plain": None,
            "draft": DraftModel(draft),
            "prompt lookup": PromptLookup(),
            "auto": ProposerMix([PromptLookup(), job_outputs, DraftModel(draft)]),
            f"plain {sampled}": None,
            f"draft {sampled}": DraftModel(draft),
        }
        proposers = {mode: proposer for mode, proposer in proposers.items() if mode in modes}
        no_draft = replace(costs, draft=dict.fromkeys(costs.draft, 0.0))  # prompt lookup's steps are free
        own_costs = {
            mode: replace(no_draft if mode == "prompt lookup" else costs, scale={}) for mode in modes
        }
        engines = {
            mode: Engine(
                target,
                proposer,
                max_rows=batch,
                k_max=8 if proposer is not None else 0,
                costs=own_costs[mode],
            )
            for mode, proposer in proposers.items()
        }
        for group in groups:
            for mode, engine in engines.items():
                temperature = t if sampled in mode else 0
                learn = job_outputs.add_output if mode == "auto" else None
                ours(runs[mode], engine, group, new=args.new, temperature=temperature, eos=eos, learn=learn)
            for i in range(0, len(group), batch):  # transformers' generate: B rows at a time, no refill
                if "hf plain generate" not in runs:
                    break
                hf_plain(runs["hf plain generate"], target, group[i : i + batch], new=args.new, pad=pad)
            if "hf assisted generate" in runs:
                hf_generate(
                    runs["hf assisted generate"], target, group, new=args.new, pad=pad, assistant_model=draft
                )
        for mode, engine in engines.items():
            absorb(runs[mode], engine)
        greedy_plain, sampled_plain = runs["plain"], runs.get(f"plain {sampled}")
        for mode, run in runs.items():
            base = sampled_plain if sampled in mode and sampled_plain else greedy_plain
            differ = "-"
            if run.engine and sampled not in mode:
                differ = str(sum(run.outputs[k] != greedy_plain.outputs[k] for k in greedy_plain.outputs))
            row = {
                "batch": batch,
                "mode": mode,
                "tps": run.tps,
                "speedup": run.tps / base.tps,
                "expected": run.expected(own_costs[mode]),
                "limit": (
                    lookup_limit(
                        own_costs[mode],
                        [(prompt_of[k], out) for k, out in greedy_plain.outputs.items()],
                        batch,
                    )
                    if mode == "prompt lookup"
                    else limit(own_costs[mode], run.alpha, batch)
                ),
                "alpha": run.alpha,
                "gamma": dict(sorted(run.gamma.items())) if run.engine else None,
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
        if batch == 8 and sampled_plain is not None:
            ratio = greedy_plain.tps / sampled_plain.tps
            print(f"#   B=8: sampled plain takes {ratio:.2f}x the time of greedy plain", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
