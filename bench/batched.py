"""Batched assisted generation vs transformers, same prompts, same process: tokens/s and ratios.

    .venv/bin/python bench/batched.py --target models/demo/target --draft models/demo/draft

Rows: HF plain greedy one prompt at a time (the reference every output is checked against), HF
batch-1 assisted (``generate(assistant_model=...)``, γ constant like ours), HF batched plain
greedy (left-padded ``generate``), and ours (worker/batched.py) at each ``--batch-sizes``.
Tokens/s = new tokens of all prompts / wall seconds of the whole set; ``lossless`` = share of
prompts whose output equals the reference token for token. Run it on a quiet machine: the
ratios are what to compare, and repeating the run shows the noise.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import PreTrainedModel

from genjob.generation.batched import BatchRequest, speculative_decode_batch
from genjob.generation.loading import load_model, load_tokenizer

log = logging.getLogger("bench.batched")


def stdlib_prompts(count: int, tokenizer, *, min_tokens: int, max_tokens: int) -> list[list[int]]:
    """Line starts from standard-library files the demo pair was not trained on (its held-out
    files: in its domain, not memorised), cut to a ragged spread of lengths."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    prompts: list[list[int]] = []
    for name in ("inspect.py", "optparse.py", "socketserver.py", "heapq.py", "_collections_abc.py"):
        for line in (stdlib / name).read_text(encoding="utf-8").splitlines():
            ids = tokenizer(line.strip())["input_ids"]
            if len(ids) >= min_tokens:
                size = min_tokens + (len(prompts) * 7) % (max_tokens - min_tokens + 1)
                prompts.append(ids[:size])
            if len(prompts) == count:
                return prompts
    return prompts


def hf_plain(target: PreTrainedModel, prompts: list[list[int]], max_new: int, eos: int) -> list[list[int]]:
    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        y = target.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False, pad_token_id=eos
        )
        out.append(_strip(y[0, len(ids) :].tolist(), eos))
    return out


def hf_assisted(target, draft, prompts, max_new: int, eos: int, gamma: int) -> list[list[int]]:
    config = draft.generation_config
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = gamma, "constant"
    config.assistant_confidence_threshold = 0.0
    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        y = target.generate(
            x,
            attention_mask=torch.ones_like(x),
            assistant_model=draft,
            max_new_tokens=max_new,
            do_sample=False,
            pad_token_id=eos,
        )
        out.append(_strip(y[0, len(ids) :].tolist(), eos))
    return out


def hf_batched_plain(target, prompts, max_new: int, eos: int, batch_size: int) -> list[list[int]]:
    out = []
    for start in range(0, len(prompts), batch_size):
        group = prompts[start : start + batch_size]
        width = max(map(len, group))
        x = torch.tensor([[eos] * (width - len(ids)) + ids for ids in group])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in group])
        y = target.generate(x, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=eos)
        out += [_strip(row[width:].tolist(), eos) for row in y]
    return out


def ours(target, draft, prompts, max_new: int, eos: int, gamma: int, batch_size: int) -> list[list[int]]:
    requests = [BatchRequest(key=i, input_ids=ids, max_new_tokens=max_new) for i, ids in enumerate(prompts)]
    results = dict(
        speculative_decode_batch(
            target, draft, requests, batch_size=batch_size, draft_tokens=gamma, eos_token_id=eos
        )
    )
    return [results[i].token_ids for i in range(len(prompts))]


def _strip(tokens: list[int], eos: int) -> list[int]:
    """Up to and including the first EOS (batched generate pads finished rows with it)."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def timed(run: Callable[[], list[list[int]]]) -> tuple[float, float, list[list[int]]]:
    """Wall seconds, this process's CPU seconds (less hit by other processes on a shared machine)."""
    started, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        outputs = run()
    return time.perf_counter() - started, time.process_time() - cpu, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-tokens", type=int, default=5, help="γ for HF assisted and ours")
    parser.add_argument("--batch-sizes", default="1,4,8,16")
    parser.add_argument("--hf-batch-size", type=int, default=8, help="B of HF batched greedy and the γ sweep")
    parser.add_argument("--sweep-draft-tokens", default="3", help="more γ for ours at --hf-batch-size")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timed runs per row (median)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    target, draft = load_model(args.target), load_model(args.draft)
    tokenizer = load_tokenizer(args.target)
    eos = tokenizer.eos_token_id
    prompts = stdlib_prompts(args.prompts, tokenizer, min_tokens=8, max_tokens=40)
    n, gamma = args.max_new_tokens, args.draft_tokens
    log.info(
        "%d prompts of %d-%d tokens, max_new_tokens %d, γ %d, torch threads %d",
        len(prompts),
        min(map(len, prompts)),
        max(map(len, prompts)),
        n,
        gamma,
        torch.get_num_threads(),
    )
    runs: list[tuple[str, Callable[[], list[list[int]]]]] = [
        ("HF plain greedy, batch 1", lambda: hf_plain(target, prompts, n, eos)),
        (f"HF assisted, batch 1 (γ={gamma})", lambda: hf_assisted(target, draft, prompts, n, eos, gamma)),
        (
            f"HF batched plain greedy, B={args.hf_batch_size}",
            lambda: hf_batched_plain(target, prompts, n, eos, args.hf_batch_size),
        ),
    ]
    for b in map(int, args.batch_sizes.split(",")):
        runs.append((f"ours, B={b} (γ={gamma})", lambda b=b: ours(target, draft, prompts, n, eos, gamma, b)))
    for g in sorted({int(x) for x in args.sweep_draft_tokens.split(",") if x} - {gamma}):
        b = args.hf_batch_size
        runs.append((f"ours, B={b} (γ={g})", lambda g=g, b=b: ours(target, draft, prompts, n, eos, g, b)))
    ours_plain = args.hf_batch_size
    runs.append(
        (f"ours plain greedy, B={ours_plain}", lambda: ours(target, None, prompts, n, eos, 0, ours_plain))
    )

    seconds: dict[str, list[float]] = {name: [] for name, _ in runs}
    cpu_seconds: dict[str, list[float]] = {name: [] for name, _ in runs}
    outputs: dict[str, list[list[int]]] = {}
    for repeat in range(args.repeats):  # interleaved, so that machine noise hits every row alike
        for name, run in runs:
            elapsed, cpu, outputs[name] = timed(run)
            seconds[name].append(elapsed)
            cpu_seconds[name].append(cpu)
            log.info("repeat %d, %s: %.2f s (CPU %.2f s)", repeat + 1, name, elapsed, cpu)
    reference = outputs[runs[0][0]]
    rates = {name: sum(map(len, outputs[name])) / statistics.median(seconds[name]) for name, _ in runs}
    assisted, batched_greedy = rates[runs[1][0]], rates[runs[2][0]]
    print()
    cpu_rates = {
        name: sum(map(len, outputs[name])) / statistics.median(cpu_seconds[name]) for name, _ in runs
    }
    print(
        "| run | new tokens | wall s (median; min–max) | tokens/s | × HF assisted | × HF batched greedy "
        "| CPU s (median) | × HF batched greedy, CPU | lossless |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, _ in runs:
        same = sum(a == b for a, b in zip(outputs[name], reference, strict=True))
        spread = f"{statistics.median(seconds[name]):.2f}; {min(seconds[name]):.2f}–{max(seconds[name]):.2f}"
        cpu_ratio = cpu_rates[name] / cpu_rates[runs[2][0]]
        print(
            f"| {name} | {sum(map(len, outputs[name]))} | {spread} | {rates[name]:.1f} | "
            f"{rates[name] / assisted:.2f} | {rates[name] / batched_greedy:.2f} | "
            f"{statistics.median(cpu_seconds[name]):.2f} | {cpu_ratio:.2f} | {same}/{len(prompts)} |"
        )


if __name__ == "__main__":
    main()
