"""A worker gives a job's memory back: its K/V caches (the target's and the draft's) are released when
each chunk ends and when its runner is evicted, so a worker's memory after ten sequential jobs is its
memory after the first (measured on a model with smollm2's K/V footprint); a chunk whose batch was
halved by an out-of-memory error ends with the batch back at its size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from genjob.generation.engine import Engine
from genjob.options import JobSpec
from genjob.settings import Settings
from genjob.worker.chunks import PROCESS
from genjob.worker.runners import RunnerCache
from tests.support.models import build_tokenizer, corpus_lines
from tests.support.processes import COST_CACHE_DIR
from tests.support.prompts import write_jsonl
from tests.worker.test_item_loop import PROMPTS, draft_spec, run_job

REPO = Path(__file__).resolve().parents[2]
JOBS, ROWS, PROMPT_TOKENS = 10, 4, 400


def smollm2_shaped(directory: Path) -> Path:
    """A random Llama with smollm2's K/V cache (30 layers, 3 K/V heads of 64, fp32: 45 KiB a token)
    and little else (a 192-wide residual, a 384-token vocabulary), so ten jobs take seconds on a CPU."""
    tokenizer = build_tokenizer()
    eos = tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=192,
        intermediate_size=64,
        num_hidden_layers=30,
        num_attention_heads=3,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=1024,
        bos_token_id=eos,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def long_prompts(directory: Path, rows: int) -> Path:
    """``rows`` different prompts of about PROMPT_TOKENS tokens."""
    tokenizer = build_tokenizer()
    ids = tokenizer("\n".join(corpus_lines()))["input_ids"]
    texts = [tokenizer.decode(ids[i * 997 : i * 997 + PROMPT_TOKENS]) for i in range(rows)]
    return write_jsonl(directory / "long.jsonl", [json.dumps({"prompt": text}) for text in texts])


def rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def run_jobs(model: str, prompts: str, jobs: int, rows: int) -> None:
    """The child: ``jobs`` sequential jobs in this one process (embedded mode: the worker's own chunk
    code), printing its RSS after each."""
    import gc

    from genjob.cli import main

    for job in range(1, jobs + 1):
        args = ["submit", prompts, "-m", model, "--mode", "none", "--batch-size", str(rows)]
        main([*args, "--max-new-tokens", "4"], standalone_mode=False)
        gc.collect()
        print(json.dumps({"job": job, "rss_mb": round(rss_mb(), 1)}), flush=True)


def test_ten_jobs_keep_no_more_memory_than_one(tmp_path: Path) -> None:
    model = smollm2_shaped(tmp_path / "model")
    prompts = long_prompts(tmp_path, ROWS)
    env = {key: value for key, value in os.environ.items() if not key.startswith("GENJOB_")}
    env |= {
        "GENJOB_DATABASE_URL": f"sqlite:///{tmp_path / 'genjob.db'}",
        "GENJOB_COST_CACHE_DIR": str(COST_CACHE_DIR),
        "GENJOB_TORCH_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    call = f"run_jobs({str(model)!r}, {str(prompts)!r}, {JOBS}, {ROWS})"
    code = f"from tests.worker.test_worker_memory import run_jobs; {call}"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rss = [json.loads(line)["rss_mb"] for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(rss) == JOBS, done.stdout
    kv_per_job_mb = ROWS * (PROMPT_TOKENS + 5) * 30 * 2 * 3 * 64 * 4 / 2**20  # ~127 MB held while it runs
    assert (JOBS - 1) * kv_per_job_mb > 0.5 * rss[0]  # kept caches would show, many times over
    print(f"RSS after job 1: {rss[0]:.0f} MB, after job {JOBS}: {rss[-1]:.0f} MB ({rss})")
    assert rss[-1] <= 1.1 * rss[0], rss


def test_a_chunk_gives_its_caches_back_and_its_batch_grows_back(
    pg_url: str, tiny_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A draft job's chunk, one round of it out of memory: every item done, the batch back at its size
    at the end, the runner's batch size unchanged, and no K/V cache kept (target's nor draft's)."""
    path = write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": p}) for p in PROMPTS * 2])
    real = Engine._round_of_decoding
    batches: list[int] = []  # rows of each round

    def flaky(self):
        batches.append(len(self.rows))
        if len(batches) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self)

    monkeypatch.setattr(Engine, "_round_of_decoding", flaky)
    spec = draft_spec(tiny_pair, batch_size=4).model_copy(update={"max_new_tokens": 12, "draft_tokens": 8})
    job, rows = run_job(Settings(database_url=pg_url), path, spec)
    assert job.status == "completed" and all(row["status"] == "done" for row in rows)
    runner = PROCESS.runners.get(job.id, spec, settings=Settings(database_url=pg_url))
    engine = runner.engine
    assert batches[2] == 4 and batches[3] == 2 and 4 in batches[4:]  # halved, then back at its size
    assert runner.batch_size == 4 and engine.row_limit == 4
    assert engine.cache.held_bytes() == 0 and engine.proposer.cache.held_bytes() == 0


def test_an_evicted_runner_gives_its_caches_back() -> None:
    released: list[str] = []

    class Runner:
        setup_extra_s = 0.0

        def __init__(self, name: str) -> None:
            self.name = name

        def release(self) -> None:
            released.append(self.name)

    cache = RunnerCache(lambda spec, settings: Runner(spec.model), size=2)
    for name in ("a", "b", "a", "c", "d"):
        cache.get(name, JobSpec(model=name, mode="none"), settings=Settings())
    assert released == ["b", "a"]  # the least recently used, as each was evicted
