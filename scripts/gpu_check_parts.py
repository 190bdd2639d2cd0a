"""The GPU check's shared pieces (the table, building a model, decoding) and its sections other than the
engine's: env, dtypes, memory, oom, embedded (see ``gpu_check``, which maps genjob's packages first).
"""

from __future__ import annotations

import copy
import gc
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from genjob.generation.attention import use_packed_attention
from genjob.generation.cost_timing import quick_prior
from genjob.generation.engine import Engine
from genjob.generation.loading import lay_out_for_cpu
from genjob.generation.proposers import PromptLookup
from genjob.generation.requests import Request

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
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


def decode(engine: Engine, prompts: Sequence[list[int]], new: int) -> tuple[float, dict[int, list[int]]]:
    """Wall seconds and each row's new tokens, greedy, no EOS (every row makes ``new`` tokens)."""
    requests = [Request(key=i, input_ids=ids, max_new_tokens=new) for i, ids in enumerate(prompts)]
    sync(engine.device)
    started = time.perf_counter()
    outputs = {done.key: done.token_ids for done in engine.generate(requests)}
    sync(engine.device)
    return time.perf_counter() - started, outputs


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
    with tempfile.TemporaryDirectory(prefix="genjob-gpu-check-") as folder:
        embedded_job(check, device, args, Path(folder))


def embedded_job(check: Check, device: torch.device, args: Any, work: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GENJOB_")}
    env |= {
        "GENJOB_DATABASE_URL": f"sqlite:///{work / 'genjob.db'}",
        "GENJOB_DEVICE": device.type,
        "GENJOB_COST_CACHE_DIR": str(work / "costs"),
    }
    python = [sys.executable, *(["-S"] if sys.flags.no_site else []), str(SCRIPT), "--genjob-cli"]

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
        try:
            result["stats"] = json.loads(stats.stdout)
        except ValueError:
            result["stats"] = f"exit {stats.returncode}: {(stats.stdout + stats.stderr).strip()[-300:]}"
    check.report["embedded"] = result
    figures = result.get("stats")
    summary = last if not isinstance(figures, dict) else (
        f"{figures.get('status')}, {figures.get('done')}/{figures.get('total')} items done, "
        f"{figures.get('tokens_per_second') or 0:.1f} tok/s decoding, α {figures.get('alpha') or 0:.2f}"
    )  # fmt: skip
    check.row(
        "embedded",
        f"demo draft job of {len(prompts)} prompts on SQLite, `genjob submit --wait`",
        f"exit {submit.returncode} in {took:.1f} s; {summary}",
    )
