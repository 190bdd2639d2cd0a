#!/usr/bin/env python3
"""The GPU check: genjob's engine on a bare GPU machine, one table on stdout and a JSON file.

Runs as it is with the machine's own ``python3`` (torch and transformers preinstalled, nothing else) from
a plain source checkout: genjob's packages are found through pyproject's package-dir mapping (no install,
no ``pip``, no network, no Postgres, no Redis). Sections (each one a failure line at worst, never a stop):
  env       GPU, torch, transformers, the kernel SDPA picks for a boolean-mask bf16 call (packed GQA)
  engine    random-weight models of real shapes built on the device from their configs (Llama-3.2-1B,
            Llama-3.1-8B, a 1B-shaped draft for the 8B; ids in, ids out, no tokenizer), at B = 1, 8, 64,
            128: plain, prompt lookup and a fixed γ with a set acceptance (``Oracle``: the target's own
            greedy continuation with probability α per token, else a wrong token; for the 8B also with
            the draft's real forwards), against transformers' ``generate`` (and static cache +
            ``torch.compile``, the overhead-free reference); wall time against device time per round
  dtypes    bf16 rows against fp32 rows (the 1B), bf16 at B = 1 against B = 8, lookup against plain
  memory    device memory after three engines, one after the other
  oom       the out-of-memory halving path (a forward that raises ``torch.OutOfMemoryError`` once)
  embedded  one embedded-mode job end to end on SQLite (the demo pair; skipped, with a line, where this
            python lacks genjob's base dependencies: sqlalchemy, pydantic-settings, alembic, …)
Random weights: the speeds are real, the acceptance is set (α) or whatever random models repeat.

    python3 scripts/gpu_check.py --out gpu_check.json          # a GPU: under 8 minutes on an H100
    python3 scripts/gpu_check.py --device cpu --quick --out x  # tiny shapes, a CPU, under 3 minutes
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.abc
import importlib.util
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class SourceTree(importlib.abc.MetaPathFinder):
    """genjob.generation → generation/, genjob.worker → worker/ … as pyproject's package-dir maps them,
    served from the source checkout (what an editable install's import hook does), without installing."""

    def __init__(self, root: Path) -> None:
        pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
        mapping = pyproject["tool"]["setuptools"]["package-dir"]
        self.packages = {name: root / folder for name, folder in mapping.items()}

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None) -> Any:
        folder = self.packages.get(name)
        if folder is None:
            return None
        init = folder / "__init__.py"
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])


sys.meta_path.insert(0, SourceTree(ROOT))
if __name__ == "__main__" and sys.argv[1:2] == ["--genjob-cli"]:  # the embedded job's `genjob …` commands
    from genjob.cli import main as cli_main

    sys.exit(cli_main(sys.argv[2:], prog_name="genjob"))

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel  # noqa: E402

from genjob.generation.attention import use_packed_attention  # noqa: E402
from genjob.generation.cost_timing import quick_prior  # noqa: E402
from genjob.generation.draft_model import DraftModel  # noqa: E402
from genjob.generation.engine import Engine  # noqa: E402
from genjob.generation.forward import to_device  # noqa: E402
from genjob.generation.loading import lay_out_for_cpu  # noqa: E402
from genjob.generation.proposers import BatchView, PromptLookup, Proposal  # noqa: E402
from genjob.generation.requests import Request, Row  # noqa: E402


def llama(
    hidden: int, ffn: int, layers: int, heads: int, kv_heads: int, vocab: int, **more: Any
) -> dict[str, Any]:
    """A LlamaConfig's shape."""
    heads_of = {"num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hidden // heads}
    return {"hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers, **heads_of,
            "vocab_size": vocab, **more}  # fmt: skip


def rope(factor: float) -> dict[str, Any]:
    """Llama 3.1's and 3.2's long-context rope."""
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    scaling["original_max_position_embeddings"] = 8192
    return {"rope_theta": 500000.0, "rope_scaling": scaling, "max_position_embeddings": 131072}


# meta-llama/Llama-3.2-1B's and Llama-3.1-8B's config.json; for --quick, tiny shapes of the same kind
LLAMA_1B = llama(2048, 8192, 16, 32, 8, 128256, tie_word_embeddings=True, **rope(32.0))
LLAMA_8B = llama(4096, 14336, 32, 32, 8, 128256, tie_word_embeddings=False, **rope(8.0))
TINY_1B = llama(64, 128, 2, 4, 2, 512, max_position_embeddings=1024)
TINY_8B = llama(128, 256, 4, 8, 2, 512, max_position_embeddings=1024)
ALPHA, GAMMA = 0.8, 4  # the fixed-γ rows: per-token acceptance α, γ drafts a round
SECTIONS = ("env", "engine", "dtypes", "memory", "oom", "embedded")


class Check:
    """The table's rows (printed as they come) and the JSON report; the time budget."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s
        self.report: dict[str, Any] = {name: {} for name in SECTIONS}
        print("| section | case | B | tok/s | vs plain | detail |\n|---|---|---|---|---|---|", flush=True)

    def row(
        self,
        section: str,
        case: str,
        detail: str,
        *,
        batch: Any = "",
        tps: float | None = None,
        speedup: float | None = None,
    ) -> None:
        cells = [
            section,
            case,
            str(batch),
            "" if tps is None else f"{tps:,.0f}",
            "" if speedup is None else f"{speedup:.2f}×",
            detail.replace("|", "/"),
        ]
        print("| " + " | ".join(cells) + " |", flush=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def guarded(self, section: str, case: str, work: Callable[[], None], *, need_s: float = 0.0) -> None:
        """Run ``work``; a failure (or too little time left) is one row, and the check goes on."""
        if self.left() < need_s:
            self.row(section, case, f"skipped: {self.left():.0f} s of the time budget left")
            self.report[section].setdefault("skipped", []).append(case)
            return
        try:
            work()
        except Exception as exc:  # one line, then the next section
            line = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            self.row(section, case, f"FAILED {line[:200]}")
            self.report[section].setdefault("failed", {})[case] = line


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(shape: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int) -> PreTrainedModel:
    """A random-weight Llama of ``shape`` made on the device, set up as ``loading.load_model`` sets one up."""
    config = LlamaConfig(**shape, bos_token_id=1, eos_token_id=None, pad_token_id=0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model: Any = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    model.generation_config.eos_token_id = None
    use_packed_attention(model)
    if device.type == "cpu":
        lay_out_for_cpu(model)
    return model  # type: ignore[no-any-return]


def prompts_for(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """B random prompts of a little under ``length`` tokens (ragged, as rows are)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length - i % 8)] for i in range(batch)]


class Oracle:
    """A fixed-γ proposer with a set acceptance: token j of a row's draft is the target's own greedy
    continuation (``reference``, precomputed) with probability ``rate``, else a wrong token. With
    ``draft`` the draft model also runs its k steps (their cost), its tokens replaced by these."""

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

    def advance(self, rows: list[Row], old_lengths: list[int], accepted: list[int], k: int) -> None:
        if self.draft is not None:
            self.draft.advance(rows, old_lengths, accepted, k)

    def release(self) -> None:
        if self.draft is not None:
            self.draft.release()


def decode(engine: Engine, prompts: Sequence[list[int]], new: int) -> tuple[float, dict[int, list[int]]]:
    """Wall seconds and each row's new tokens, greedy, no EOS (every row makes ``new`` tokens)."""
    requests = [Request(key=i, input_ids=ids, max_new_tokens=new) for i, ids in enumerate(prompts)]
    sync(engine.device)
    started = time.perf_counter()
    outputs = {done.key: done.token_ids for done in engine.generate(requests)}
    sync(engine.device)
    return time.perf_counter() - started, outputs


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


def section_env(check: Check, device: torch.device) -> None:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {
            "gpu": props.name,
            "capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "cudnn": torch.backends.cudnn.version(),
        }
    for key, value in env.items():
        check.row("env", key, str(value))
    check.report["env"] = env

    def sdpa() -> None:  # a verification: 8 rows of 5 tokens, Llama-3.1-8B's 32 heads on 8 K/V heads
        from torch.nn.attention import SDPBackend

        dtype = torch.bfloat16
        query = torch.randn(8, 8, 4 * 5, 128, device=device, dtype=dtype)  # packed: groups·q queries
        keys = torch.randn(8, 8, 512, 128, device=device, dtype=dtype)
        mask = torch.rand(8, 1, 4 * 5, 512, device=device) < 0.9
        choice = SDPBackend(torch._fused_sdp_choice(query, keys, keys, mask, 0.0, False)).name
        torch.nn.functional.scaled_dot_product_attention(query, keys, keys, attn_mask=mask)
        sync(device)
        env["sdpa_bool_mask_bf16"] = choice
        check.row("env", "SDPA, boolean mask, bf16 (8×8×20 q, 512 keys)", choice)

    check.guarded("env", "SDPA kernel", sdpa)


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
    for run in runs.values():  # device time a round: a short profiled run of the same engine
        engine = run.pop("engine")
        stats = engine.stats
        before = stats.rounds
        used = device_seconds(device, lambda e=engine: decode(e, prompts, short))
        rounds = max(stats.rounds - before, 1)
        tried = stats.accepted + stats.rejections
        run |= {
            "tps": tokens / run["seconds"],
            "rounds": stats.rounds,
            "tokens_per_round": stats.tokens / max(stats.rounds, 1),
            "alpha": stats.accepted / tried if tried else None,
            "wall_ms_per_round": 1e3 * stats.seconds / max(stats.rounds, 1),
            "device_ms_per_round": None if used is None else 1e3 * used / rounds,
        }
    base = runs["plain"]["tps"]
    for mode, run in runs.items():
        alpha = "-" if run.get("alpha") is None else f"{run['alpha']:.2f}"
        device_ms = "-" if run["device_ms_per_round"] is None else f"{run['device_ms_per_round']:.2f}"
        same = f", rows = plain {run['same']}/{batch}" if "same" in run else ""
        per_row = run["tokens_per_round"] / batch
        detail = (
            f"{per_row:.2f} tok/row-round, α {alpha}; a round {run['wall_ms_per_round']:.2f} ms wall, "
            f"{device_ms} ms device{same}"
        )
        check.row("engine", f"{name} {mode}", detail, batch=batch, tps=run["tps"], speedup=run["tps"] / base)

    def reference_rows(label: str, **options: Any) -> None:
        if options.get("cache_implementation") == "static":
            first = hf_generate(target, prompts, args.new, **options)  # compiles (CUDA): not counted
            options_note = f"first call {first:.1f} s (compiling on CUDA), then"
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
            else ("hf generate, static cache (no compile on a CPU)")
        )
        options: dict[str, Any] = {"cache_implementation": "static"}
        if device.type != "cuda":
            options["disable_compile"] = True
        check.guarded("engine", f"{name} {label}", lambda: reference_rows(label, **options), need_s=60)
    results[str(batch)] = runs


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def section_dtypes(check: Check, fp32: Any, args: Any) -> None:
    """The 1B's rows in fp32 and in bf16 (the same weights), plain and speculative, at B = 1 and B."""
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    batch, new = args.dtype_batch, args.new
    prompts = prompts_for(batch, args.prompt, fp32.config.vocab_size, seed=7)
    _, exact = decode(Engine(fp32, None, max_rows=batch), prompts, new)
    _, plain = decode(Engine(bf16, None, max_rows=batch), prompts, new)
    alone: dict[int, list[int]] = {}
    for key, ids in enumerate(prompts):
        alone[key] = decode(Engine(bf16, None, max_rows=1), [ids], new)[1][0]
    costs = quick_prior(bf16, None, batches=[1, batch], max_query=9)
    _, lookup = decode(Engine(bf16, PromptLookup(), max_rows=batch, costs=costs), prompts, new)
    _, lookup32 = decode(
        Engine(fp32, PromptLookup(), max_rows=batch, costs=replace(costs, scale={})), prompts, new
    )
    report = check.report["dtypes"]
    pairs = {
        f"bf16 plain B={batch} vs fp32 plain B={batch}": (plain, exact),
        f"bf16 plain B=1 vs bf16 plain B={batch}": (alone, plain),
        f"bf16 prompt lookup vs bf16 plain, B={batch}": (lookup, plain),
        f"fp32 prompt lookup vs fp32 plain, B={batch}": (lookup32, exact),
    }
    for case, (a, b) in pairs.items():
        same = sum(a[k] == b[k] for k in b)
        firsts = [first_difference(a[k], b[k]) for k in b if a[k] != b[k]]
        where = f"; differing rows part at token {min(firsts)}–{max(firsts)} of {new}" if firsts else ""
        report[case] = {"same": same, "rows": batch, "first_differences": firsts}
        check.row("dtypes", case, f"{same}/{batch} rows identical{where}", batch=batch)
    del bf16


def memory_now(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        return {
            "allocated_mib": torch.cuda.memory_allocated(device) / 2**20,
            "reserved_mib": torch.cuda.memory_reserved(device) / 2**20,
        }
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return {"rss_mib": pages * os.sysconf("SC_PAGE_SIZE") / 2**20}


def section_memory(check: Check, target: Any, args: Any) -> None:
    """Three engines one after the other (a job each, dropped after it): memory must come back."""
    device, batch = target.device, args.memory_batch
    prompts = prompts_for(batch, args.prompt, target.config.vocab_size, seed=11)
    costs = quick_prior(target, None, batches=[1, batch], max_query=9)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    readings = [memory_now(device)]
    for _ in range(3):
        engine = Engine(target, PromptLookup(), max_rows=batch, costs=replace(costs, scale={}))
        decode(engine, prompts, args.new)
        del engine
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        readings.append(memory_now(device))
    check.report["memory"] = {"batch": batch, "readings": readings}
    for key in readings[0]:
        values = ", ".join(f"{r[key]:,.0f}" for r in readings[1:])
        case = f"{key} before, then after each of 3 engines"
        check.row("memory", case, f"{readings[0][key]:,.0f}; {values}", batch=batch)


def section_oom(check: Check, target: Any, args: Any) -> None:
    """A forward raises ``torch.OutOfMemoryError`` once, mid-job: the batch halves and every row ends."""
    batch = args.dtype_batch
    prompts = prompts_for(batch, args.prompt, target.config.vocab_size, seed=13)
    _, reference = decode(Engine(target, None, max_rows=batch), prompts, args.new)
    calls = {"n": 0}

    def fail_once(module: Any, inputs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 4:  # the prefill, two rounds, then out of memory
            raise torch.OutOfMemoryError("simulated by scripts/gpu_check.py")

    handle = target.register_forward_pre_hook(fail_once)
    try:
        engine = Engine(target, None, max_rows=batch)
        _, outputs = decode(engine, prompts, args.new)
    finally:
        handle.remove()
    same = sum(outputs.get(k) == v for k, v in reference.items())
    result = {
        "oom_events": engine.stats.oom_events,
        "max_rows_after": engine.max_rows,
        "rows": batch,
        "finished": len(outputs),
        "same_as_without": same,
    }
    check.report["oom"] = result
    check.row(
        "oom",
        "one simulated OOM mid-job",
        f"{engine.stats.oom_events} OOM event(s); batch {batch} → "
        f"{engine.max_rows} at the end; {len(outputs)}/{batch} rows finished, {same} equal to the run "
        "without it",
        batch=batch,
    )


def section_embedded(check: Check, device: torch.device, args: Any) -> None:
    """``genjob submit`` in embedded mode (no broker) on SQLite, the demo pair, then ``genjob stats``."""
    work = Path(tempfile.mkdtemp(prefix="genjob-gpu-check-"))
    env = {key: value for key, value in os.environ.items() if not key.startswith("GENJOB_")}
    env |= {
        "GENJOB_DATABASE_URL": f"sqlite:///{work / 'genjob.db'}",
        "GENJOB_DEVICE": device.type,
        "GENJOB_COST_CACHE_DIR": str(work / "costs"),
    }
    python = [
        sys.executable,
        *(["-S"] if sys.flags.no_site else []),
        str(Path(__file__).resolve()),
        "--genjob-cli",
    ]

    def genjob(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*python, *arguments],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=max(check.left(), 30),
        )

    prompts = (ROOT / "examples" / "prompts.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    if args.quick:  # a CPU shared with others: 4 prompts, 4 rows (no measuring of the best batch size)
        prompts, env["GENJOB_BATCH_SIZE"] = prompts[:4], "4"
    (work / "prompts.jsonl").write_text("".join(prompts), encoding="utf-8")
    started = time.perf_counter()
    demo = ROOT / "models" / "demo"
    submit = genjob(
        "submit",
        "prompts.jsonl",
        "-m",
        str(demo / "target"),
        "-a",
        str(demo / "draft"),
        "--max-new-tokens",
        str(args.new),
        "--wait",
    )
    took = time.perf_counter() - started
    missing = [line for line in submit.stderr.splitlines() if line.startswith("ModuleNotFoundError")]
    if missing:
        line = missing[-1].removeprefix("ModuleNotFoundError: ")
        check.report["embedded"] = {"skipped": line}
        check.row(
            "embedded",
            "a job on SQLite",
            f"skipped: {line} (genjob's base dependencies are not "
            "importable here: carry them beside the tree, see docs/benchmarks.md)",
        )
        return
    job = submit.stdout.strip()
    last = (submit.stderr.strip().splitlines() or [""])[-1]
    result: dict[str, Any] = {"exit": submit.returncode, "seconds": took, "job": job, "stderr_tail": last}
    if submit.returncode == 0:
        stats = genjob("stats", job, "--json")
        result["stats"] = json.loads(stats.stdout) if stats.returncode == 0 else stats.stderr.strip()[-300:]
    check.report["embedded"] = result
    figures = result.get("stats") if isinstance(result.get("stats"), dict) else {}
    summary = ", ".join(
        f"{key} {figures[key]}" for key in ("done", "total", "tokens_per_second") if key in figures
    )
    check.row(
        "embedded",
        f"demo draft job of {len(prompts)} prompts on SQLite, `genjob submit --wait`",
        f"exit {submit.returncode} in {took:.1f} s; {summary or last}",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="torch device (default cuda)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, B = 1 and 8, short rows")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON report")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"some of {','.join(SECTIONS)}")
    parser.add_argument("--budget-s", type=float, help="start no work after this (default 420, quick 150)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check (use --device cpu --quick here)", file=sys.stderr)
        return 1
    quick = args.quick
    args.batches = [1, 8] if quick else [1, 8, 64, 128]
    args.compile_batches = {1}  # a compile takes a minute or more per shape
    args.prompt, args.new = (24, 16) if quick else (128, 64)
    args.dtype_batch, args.memory_batch, args.need_s = (4, 8, 5) if quick else (8, 64, 20)
    small, large = (TINY_1B, TINY_8B) if quick else (LLAMA_1B, LLAMA_8B)
    wanted = set(args.sections.split(","))
    torch.set_num_threads(min(torch.get_num_threads(), 2 if quick else 16))
    check = Check(args.budget_s or (150 if quick else 420))
    check.report["args"] = {
        "device": args.device,
        "quick": quick,
        "batches": args.batches,
        "prompt": args.prompt,
        "new_tokens": args.new,
    }
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if "env" in wanted:
        section_env(check, device)
    if wanted & {"engine", "dtypes", "memory", "oom"}:
        small_name = "1B" if not quick else "tiny 1B-like"
        one_b = build(small, device, dtype, seed=1)
        warm = prompts_for(2, args.prompt, one_b.config.vocab_size, seed=0)
        decode(Engine(one_b, None, max_rows=2), warm, 4)  # first calls (kernels, allocator) not timed
        if "engine" in wanted:
            bench_model(check, small_name, one_b, None, args.batches, args)
        if "memory" in wanted:
            check.guarded("memory", "three engines", lambda: section_memory(check, one_b, args), need_s=10)
        if "oom" in wanted:
            check.guarded("oom", "halving", lambda: section_oom(check, one_b, args), need_s=5)
        del one_b
        gc.collect()
        if "dtypes" in wanted:

            def dtypes() -> None:
                fp32 = build(small, device, torch.float32, seed=1)
                section_dtypes(check, fp32, args)

            check.guarded("dtypes", "bf16 vs fp32", dtypes, need_s=15)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if "engine" in wanted:

            def large_model() -> None:
                name = "8B" if not quick else "tiny 8B-like"
                target = build(large, device, dtype, seed=2)
                draft = build(small, device, dtype, seed=3)
                decode(Engine(target, None, max_rows=2), warm, 4)
                bench_model(check, name, target, draft, args.batches, args)

            check.guarded("engine", "8B", large_model, need_s=60 if not quick else 5)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if "embedded" in wanted:
        check.guarded("embedded", "job on SQLite", lambda: section_embedded(check, device, args), need_s=20)
    args.out.write_text(json.dumps(check.report, indent=1, default=str), encoding="utf-8")
    print(f"# report: {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
