"""The GPU check's engine section: every mode at each B against transformers' ``generate``.

``Oracle`` is the fixed-γ proposer with a set acceptance; a round's device time comes from the profiler
over a short run of the same engine, its wall time from the engine's own statistics.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from gpu_check_parts import Check, decode, prompts_for, sync

from genjob.generation.cost_timing import quick_prior
from genjob.generation.draft_model import DraftModel
from genjob.generation.engine import Engine
from genjob.generation.forward import to_device
from genjob.generation.proposers import BatchView, ModelFree, PromptLookup, Proposal
from genjob.generation.requests import Row

ALPHA, GAMMA = 0.8, 4  # the fixed-γ rows: per-token acceptance α, γ drafts a round


class Oracle(ModelFree):
    """A fixed-γ proposer with a set acceptance: token j of a row's draft is the target's own greedy
    continuation (``reference``, precomputed) with probability ``rate``, else a wrong token. With
    ``draft`` the draft model also runs its k steps (their cost), its tokens replaced by these; the
    engine is not told of it (``model`` and ``cache`` None, as ``ModelFree``): its costs are the target's."""

    name = "oracle"

    def __init__(
        self, reference: dict[int, list[int]], rate: float, vocab: int, draft: DraftModel | None = None
    ):
        self.reference, self.rate, self.vocab, self.draft = reference, rate, vocab, draft
        self.rng = random.Random(0)

    def reserve(self, slots: int, capacity: int) -> None:
        if self.draft is not None:
            self.draft.reserve(slots, capacity)

    def admit(self, start: int, rows: list[Row], input_ids: torch.Tensor, lengths: torch.Tensor) -> None:
        if self.draft is not None:
            self.draft.admit(start, rows, input_ids, lengths)

    def move(self, source: int, target: int, columns: int) -> None:
        if self.draft is not None:
            self.draft.move(source, target, columns)

    def available(self, rows: list[Row], k: int) -> list[int]:
        return [k] * len(rows)

    def propose(self, view: BatchView, k: int) -> Proposal:
        if self.draft is not None:
            self.draft.propose(view, k)  # the draft's forwards, for their cost only
        guesses = []
        for row in view.rows:
            truth = self.reference.get(row.request.key, [])
            at = len(row.tokens)  # the output index of the first draft
            for j in range(k):
                right = truth[at + j] if at + j < len(truth) else 0
                guesses.append(right if self.rng.random() < self.rate else (right + 1) % self.vocab)
        tokens = to_device(guesses, view.pending.device).reshape(len(view.rows), k)
        return Proposal(tokens=tokens, counts=[k] * len(view.rows), probs=None)

    def advance(
        self, rows: list[Row], old_lengths: list[int], accepted: list[int], k: int, drafted: list[int]
    ) -> None:
        if self.draft is not None:
            self.draft.advance(rows, old_lengths, accepted, k, drafted)

    def release(self) -> None:
        if self.draft is not None:
            self.draft.release()


def device_seconds(device: torch.device, work: Callable[[], Any]) -> float | None:
    """The device's kernel time while ``work`` runs (the profiler's), None off CUDA."""
    if device.type != "cuda":
        work()
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        sync(device)
    events = prof.key_averages()
    micro = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in events)
    return float(micro) / 1e6


def hf_generate(model: Any, prompts: Sequence[list[int]], new: int, **options: Any) -> float:
    """transformers' batched greedy ``generate`` (left padding, its own SDPA): wall seconds."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    own = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        sync(model.device)
        started = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
                **options,
            )
        sync(model.device)
        return time.perf_counter() - started
    finally:
        model.set_attn_implementation(own)


def bench_model(check: Check, name: str, target: Any, draft: Any, batches: Sequence[int], args: Any) -> None:
    """Every mode at each B on ``target`` (a failure at one B is a line, the next B runs)."""
    for batch in batches:
        work = partial(bench_batch, check, name, target, draft, batch, args)
        check.guarded("engine", f"{name} B={batch}", work, need_s=args.need_s)


def bench_batch(check: Check, name: str, target: Any, draft: Any, batch: int, args: Any) -> None:
    """Every mode on ``target`` at one B: rows of the engine section."""
    device, vocab = target.device, target.config.vocab_size
    results = check.report["engine"].setdefault(name, {})
    prompts = prompts_for(batch, args.prompt, vocab, seed=batch)
    tokens = batch * args.new
    runs: dict[str, dict[str, Any]] = {}
    plain = Engine(target, None, max_rows=batch)
    seconds, reference = decode(plain, prompts, args.new)
    runs["plain"] = {"engine": plain, "seconds": seconds}
    costs = quick_prior(target, None, batches=[1, batch], max_query=9)  # a worker's cheap prior
    proposers: dict[str, tuple[Any, int, int | None]] = {
        "prompt lookup": (PromptLookup(), 8, None),
        f"fixed γ={GAMMA}, α={ALPHA}": (Oracle(reference, ALPHA, vocab), GAMMA, GAMMA),
    }
    if draft is not None:
        oracle = Oracle(reference, ALPHA, vocab, DraftModel(draft))
        proposers[f"fixed γ={GAMMA}, α={ALPHA}, 1B draft's steps"] = (oracle, GAMMA, GAMMA)
    for mode, (proposer, k_max, fixed) in proposers.items():
        engine = Engine(
            target, proposer, max_rows=batch, k_max=k_max, fixed_k=fixed, costs=replace(costs, scale={})
        )
        seconds, outputs = decode(engine, prompts, args.new)
        same = sum(outputs[key] == reference[key] for key in reference)
        runs[mode] = {"engine": engine, "seconds": seconds, "same": same}
    short = min(args.new, 16)
    for run in runs.values():
        engine = run.pop("engine")
        stats = engine.stats
        tried = stats.accepted + stats.rejections
        run |= {
            "tps": tokens / run["seconds"],
            "rounds": stats.rounds,
            "tokens_per_row_round": stats.tokens / max(stats.rows_sum, 1),
            "alpha": stats.accepted / tried if tried else None,
            "wall_ms_per_round": 1e3 * stats.seconds / max(stats.rounds, 1),
        }
        before = stats.rounds  # then device time a round: a short profiled run of the same engine
        used = device_seconds(device, lambda e=engine: decode(e, prompts, short))
        run["device_ms_per_round"] = None if used is None else 1e3 * used / max(stats.rounds - before, 1)
    base = runs["plain"]["tps"]
    for mode, run in runs.items():
        alpha = "-" if run.get("alpha") is None else f"{run['alpha']:.2f}"
        device_ms = "-" if run["device_ms_per_round"] is None else f"{run['device_ms_per_round']:.2f}"
        same = f", rows = plain {run['same']}/{batch}" if "same" in run else ""
        per_row = run["tokens_per_row_round"]
        detail = (
            f"{per_row:.2f} tok/row-round, α {alpha}; a round {run['wall_ms_per_round']:.2f} ms wall, "
            f"{device_ms} ms device{same}"
        )
        check.row("engine", f"{name} {mode}", detail, batch=batch, tps=run["tps"], speedup=run["tps"] / base)

    def reference_rows(label: str, **options: Any) -> None:
        if options.get("cache_implementation") == "static":
            first = hf_generate(target, prompts, args.new, **options)  # compiles (CUDA): not counted
            compiling = " (compiling)" if device.type == "cuda" else ""
            options_note = f"first call {first:.1f} s{compiling}, then"
        else:
            options_note = ""
        seconds = hf_generate(target, prompts, args.new, **options)
        runs[label] = {"tps": tokens / seconds, "seconds": seconds}
        check.row(
            "engine",
            f"{name} {label}",
            f"{options_note} {seconds:.2f} s".strip(),
            batch=batch,
            tps=tokens / seconds,
            speedup=tokens / seconds / base,
        )

    check.guarded("engine", f"{name} hf generate", lambda: reference_rows("hf generate"))
    if batch in args.compile_batches:
        label = (
            "hf generate, static cache + torch.compile"
            if device.type == "cuda"
            else "hf generate, static cache (no compile on a CPU)"
        )
        options: dict[str, Any] = {"cache_implementation": "static"}
        if device.type != "cuda":
            options["disable_compile"] = True
        check.guarded("engine", f"{name} {label}", lambda: reference_rows(label, **options), need_s=60)
    results[str(batch)] = runs
