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
import gc
import importlib.abc
import importlib.util
import json
import os
import sys
import tomllib
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
from gpu_check_engine import bench_model  # noqa: E402
from gpu_check_parts import (  # noqa: E402
    SECTIONS,
    Check,
    build,
    decode,
    prompts_for,
    section_dtypes,
    section_embedded,
    section_env,
    section_memory,
    section_oom,
)

from genjob.generation.engine import Engine  # noqa: E402


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


def warm_up(model: Any) -> None:
    """A short decode, so first calls (kernels chosen, the allocator growing) are timed in no row."""
    prompts = prompts_for(2, 16, model.config.vocab_size, seed=0)
    decode(Engine(model, None, max_rows=2), prompts, 4)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


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
    if "env" in wanted:
        section_env(check, device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    small_name, large_name = ("tiny 1B-like", "tiny 8B-like") if quick else ("1B", "8B")

    def on_the_1b() -> None:  # engine rows, memory, OOM on the 1B (the model dropped after)
        one_b = build(small, device, dtype, seed=1)
        warm_up(one_b)
        if "engine" in wanted:
            bench_model(check, small_name, one_b, None, args.batches, args)
        if "memory" in wanted:
            check.guarded("memory", "three engines", lambda: section_memory(check, one_b, args), need_s=10)
        if "oom" in wanted:
            check.guarded("oom", "halving", lambda: section_oom(check, one_b, args), need_s=5)

    def dtypes() -> None:
        section_dtypes(check, build(small, device, torch.float32, seed=1), args)

    def on_the_8b() -> None:
        target = build(large, device, dtype, seed=2)
        draft = build(small, device, dtype, seed=3)
        warm_up(target)
        bench_model(check, large_name, target, draft, args.batches, args)

    if wanted & {"engine", "memory", "oom"}:
        check.guarded("engine", small_name, on_the_1b)
        free(device)
    if "dtypes" in wanted:
        check.guarded("dtypes", "bf16 vs fp32", dtypes, need_s=15)
        free(device)
    if "engine" in wanted:
        check.guarded("engine", large_name, on_the_8b, need_s=5 if quick else 60)
        free(device)
    if "embedded" in wanted:
        check.guarded("embedded", "job on SQLite", lambda: section_embedded(check, device, args), need_s=20)
    args.out.write_text(json.dumps(check.report, indent=1, default=str), encoding="utf-8")
    print(f"# report: {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
