"""Train a small target/draft GPT-2 pair on the Python stdlib for assisted-generation demos (CPU, offline).

A byte-level BPE tokenizer and a deep, narrow target GPT-2 are trained from scratch on the stdlib's top-level
``*.py`` files (a few held out by name hash); a 1-layer draft, started from the target's embeddings and first
block, is distilled from it (KL on the target's logits + a little CE). Both are saved as fp16 safetensors with
the tokenizer, held-out prompts go to ``examples/prompts.jsonl``, and the pair is benchmarked: cost ratio c,
acceptance rate alpha, plain greedy vs. HF assisted generation vs. a minimal hand-written speculative loop.

    .venv/bin/python scripts/train_demo_pair.py --out models/demo [--eval-only]
"""

from __future__ import annotations

import os

# Set before torch loads OpenMP: with spinning (active) waits, 2 threads on a shared 2-core box crawl.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import ast
import copy
import hashlib
import json
import logging
import math
import statistics
import sys
import sysconfig
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from demo_pair_eval import EOS, PAD, bench, write_model_card
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
)

LOG = logging.getLogger("train_demo_pair")


# ----------------------------------------------------------------------------- data
def split_stdlib(n_holdout: int) -> tuple[list[Path], list[Path]]:
    """Top-level stdlib ``*.py`` files, split into (train, held-out) by a hash of the file name."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    ranked = sorted(files, key=lambda p: hashlib.md5(p.name.encode()).hexdigest())
    held = set(ranked[:n_holdout])
    return [p for p in files if p not in held], sorted(held)


def build_tokenizer(texts: list[str], vocab_size: int, max_len: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=PAD,
        padding_side="left",
        model_max_length=max_len,
    )


def encode(tok: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """One flat token stream; every file is followed by EOS."""
    ids: list[int] = []
    for t in texts:
        ids += tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


def random_batch(data: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(data) - seq_len, (batch,), generator=gen)
    return torch.stack([data[s : s + seq_len] for s in starts.tolist()])


# ----------------------------------------------------------------------------- models & training
def make_model(
    tok: PreTrainedTokenizerFast, layers: int, width: int, heads: int, n_pos: int
) -> GPT2LMHeadModel:
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_positions=n_pos,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        activation_function="gelu_pytorch_tanh",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = GPT2LMHeadModel(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def eval_loss(model: GPT2LMHeadModel, blocks: torch.Tensor, batch: int = 8) -> float:
    model.eval()
    losses = [model(b, labels=b).loss.item() for b in blocks.split(batch)]
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def agreement(draft: GPT2LMHeadModel, target: GPT2LMHeadModel, blocks: torch.Tensor) -> float:
    """Teacher-forced top-1 agreement of draft and target (a proxy for the acceptance rate)."""
    draft.eval()
    hits = [
        (draft(b).logits.argmax(-1) == target(b).logits.argmax(-1)).float().mean().item()
        for b in blocks.split(8)
    ]
    draft.train()
    return sum(hits) / len(hits)


def train_loop(
    model: GPT2LMHeadModel,
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    data: torch.Tensor,
    steps: int,
    batch: int,
    lr: float,
    args: argparse.Namespace,
    name: str,
    on_eval: Callable[[], str],
) -> list[float]:
    """AdamW + warmup/cosine; ``loss_fn`` maps a token batch to a scalar loss. Returns the loss curve."""
    gen = torch.Generator().manual_seed(args.seed + sum(map(ord, name)))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    curve: list[float] = []
    t0 = time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, args.warmup)
        x = random_batch(data, batch, args.seq_len, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = loss_fn(x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        curve.append(loss.item())
        if (step + 1) % args.log_every == 0 or step + 1 == steps:
            msg = on_eval() if (step + 1) % args.eval_every == 0 or step + 1 == steps else ""
            LOG.info(
                "%s step %d/%d loss %.4f (avg %.4f) lr %.2e %.0fs %s",
                name,
                step + 1,
                steps,
                curve[-1],
                statistics.fmean(curve[-args.log_every :]),
                opt.param_groups[0]["lr"],
                time.perf_counter() - t0,
                msg,
            )
    model.eval()
    return curve


def grow(model: GPT2LMHeadModel, n_layer: int) -> GPT2LMHeadModel:
    """Deepen ``model`` function-preservingly: block j copies old block j*L/n_layer; every repeat gets zero
    output projections, so it starts as the identity (cheap progressive stacking)."""
    cfg = copy.deepcopy(model.config)
    cfg.n_layer = n_layer
    bigger, old = GPT2LMHeadModel(cfg), model.config.n_layer
    src = [j * old // n_layer for j in range(n_layer)]
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("transformer.h.")}
    for j, i in enumerate(src):
        for key, value in model.transformer.h[i].state_dict().items():
            repeat = j > 0 and src[j - 1] == i and ".c_proj." in f".{key}"
            state[f"transformer.h.{j}.{key}"] = torch.zeros_like(value) if repeat else value.clone()
    bigger.load_state_dict(state, strict=False)
    bigger.tie_weights()
    bigger.generation_config = copy.deepcopy(model.generation_config)
    return bigger


def train_target(
    target: GPT2LMHeadModel, train: torch.Tensor, held: torch.Tensor, args: argparse.Namespace
) -> tuple[GPT2LMHeadModel, dict[str, float]]:
    """Progressive stacking: train a shallow model, deepen it (function-preserving), train again, ..."""
    t0, curve, stage_eval = time.perf_counter(), [], {}
    for i, (layers, steps) in enumerate(args.stages):
        if layers != target.config.n_layer:
            before = eval_loss(target, held)
            target = grow(target, layers)
            LOG.info(
                "grew target to %d layers: held-out loss %.4f -> %.4f",
                layers,
                before,
                eval_loss(target, held),
            )
        model = target
        curve = train_loop(
            model,
            lambda x, m=model: m(x, labels=x).loss,
            train,
            steps,
            args.target_batch,
            args.lr * (1 if i == 0 else args.grow_lr_scale),
            args,
            f"target-L{layers}",
            lambda m=model: f"eval {eval_loss(m, held):.4f}",
        )
        stage_eval[f"L{layers}"] = eval_loss(target, held)
    stats = dict(train_loss=statistics.fmean(curve[-args.log_every :]), eval_loss=stage_eval[f"L{layers}"])
    return target, dict(stats, stage_eval=stage_eval, minutes=(time.perf_counter() - t0) / 60)


def distil_draft(
    draft: GPT2LMHeadModel,
    target: GPT2LMHeadModel,
    train: torch.Tensor,
    held: torch.Tensor,
    args: argparse.Namespace,
) -> dict[str, float]:
    target.eval().requires_grad_(False)

    def loss_fn(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t_logp = F.log_softmax(target(x).logits.float(), -1).flatten(0, 1)
        s_logits = draft(x).logits.float().flatten(0, 1)
        kl = F.kl_div(F.log_softmax(s_logits, -1), t_logp, log_target=True, reduction="batchmean")
        ce = F.cross_entropy(s_logits[:-1], x.flatten()[1:])  # crosses block rows once per row: negligible
        return kl + args.ce_weight * ce

    t0 = time.perf_counter()

    def report() -> str:
        return f"eval_ce {eval_loss(draft, held):.4f} agree {agreement(draft, target, held):.3f}"

    curve = train_loop(
        draft, loss_fn, train, args.draft_steps, args.draft_batch, args.draft_lr, args, "draft", report
    )
    return dict(
        train_loss=statistics.fmean(curve[-args.log_every :]),
        eval_loss=eval_loss(draft, held),
        agreement=agreement(draft, target, held),
        minutes=(time.perf_counter() - t0) / 60,
    )


def init_draft_from_target(draft: GPT2LMHeadModel, target: GPT2LMHeadModel) -> None:
    """Copy embeddings, final norm and the first blocks when widths match (faster distillation)."""
    if draft.config.n_embd != target.config.n_embd:
        return
    d, t = draft.transformer, target.transformer
    d.wte.load_state_dict(t.wte.state_dict())
    d.wpe.load_state_dict(t.wpe.state_dict())
    d.ln_f.load_state_dict(t.ln_f.state_dict())
    for i, block in enumerate(d.h):
        block.load_state_dict(t.h[i].state_dict())
    draft.tie_weights()


def save(model: GPT2LMHeadModel, tok: PreTrainedTokenizerFast, path: Path) -> None:
    """fp16 safetensors on disk; config.json says float32 so ``dtype="auto"`` loads fp32 for CPU use."""
    copy.deepcopy(model).to(torch.float16).save_pretrained(path)
    tok.save_pretrained(path)
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


# ----------------------------------------------------------------------------- prompts
def extract_prompts(files: list[Path], n: int) -> list[dict[str, str]]:
    """Short ``def ...:`` + docstring beginnings from held-out files, round-robin over files."""
    per_file: list[list[dict[str, str]]] = []
    for path in files:
        src = path.read_text(encoding="utf-8")
        lines, found = src.splitlines(), []
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.decorator_list:
                continue
            doc = node.body[0]
            if ast.get_docstring(node) and doc.end_lineno - node.lineno < 5:
                text = textwrap.dedent("\n".join(lines[node.lineno - 1 : doc.end_lineno]))
                found.append({"id": f"{path.stem}.{node.name}", "prompt": text})
        per_file.append(sorted(found, key=lambda p: p["id"])[:: max(1, len(found) // 3)])
    out: list[dict[str, str]] = []
    for i in range(max(map(len, per_file), default=0)):
        out += [f[i] for f in per_file if i < len(f)]
    return out[:n]


# ----------------------------------------------------------------------------- CLI
OPTIONS: dict[str, tuple[Any, str]] = {  # --flag: (default, help)
    "seed": (1234, ""),
    "threads": (2, "torch threads for training"),
    "vocab_size": (2048, "BPE vocab"),
    "holdout_files": (8, "stdlib files held out for eval/prompts"),
    "seq_len": (256, "block = n_positions"),
    "target_stages": ("2:900,10:60,20:40", "progressive stacking, layers:steps,... (last = target depth)"),
    "target_width": (160, ""),
    "target_heads": (4, ""),
    "target_batch": (16, ""),
    "lr": (3e-3, "target lr"),
    "grow_lr_scale": (0.5, "peak lr of the stages after the first, relative to --lr"),
    "draft_layers": (1, ""),
    "draft_width": (160, "= target width to start from its layers"),
    "draft_heads": (4, ""),
    "draft_steps": (120, ""),
    "draft_batch": (16, ""),
    "draft_lr": (3e-3, ""),
    "ce_weight": (0.1, "CE weight next to the KL when distilling"),
    "warmup": (20, "lr warmup per stage"),
    "log_every": (10, ""),
    "eval_every": (50, ""),
    "n_prompts": (12, ""),
    "max_new_tokens": (96, "benchmark"),
    "bench_repeats": (2, "best-of runs per prompt"),
    "bench_threads": (1, "tiny models gain nothing from 2"),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("models/demo"))
    p.add_argument("--prompts-out", type=Path, default=Path("examples/prompts.jsonl"))
    p.add_argument("--eval-only", action="store_true", help="only benchmark the saved pair")
    p.add_argument("--skip-target", action="store_true", help="reuse the saved target, re-distil the draft")
    p.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in fp32, not bf16 autocast")
    for key, (default, help_text) in OPTIONS.items():
        p.add_argument(f"--{key.replace('_', '-')}", type=type(default), default=default, help=help_text)
    args = p.parse_args()
    args.stages = [tuple(map(int, stage.split(":"))) for stage in args.target_stages.split(",")]
    args.target_layers, args.target_steps = args.stages[-1][0], sum(n for _, n in args.stages)
    return args


def train_pair(args: argparse.Namespace, train_files: list[Path], held_files: list[Path]) -> dict[str, Any]:
    t_start, t_dir = time.perf_counter(), args.out / "target"
    train_texts, held_texts = (
        [p.read_text(encoding="utf-8", errors="replace") for p in fs] for fs in (train_files, held_files)
    )
    if args.skip_target:
        tok = AutoTokenizer.from_pretrained(t_dir)
        target = AutoModelForCausalLM.from_pretrained(t_dir, dtype=torch.float32)
        t_stats = json.loads((args.out / "metrics.json").read_text())["target"]
    else:
        tok = build_tokenizer(train_texts, args.vocab_size, args.seq_len)
    train, held = encode(tok, train_texts), encode(tok, held_texts)
    n_blocks = min(48, len(held) // args.seq_len)
    held_blocks = held[: n_blocks * args.seq_len].view(n_blocks, args.seq_len)
    LOG.info(
        "tokenizer vocab %d; %d train / %d held-out tokens (%.2f bytes/token)",
        len(tok),
        len(train),
        len(held),
        sum(map(len, train_texts)) / len(train),
    )
    if not args.skip_target:
        target = make_model(tok, args.stages[0][0], args.target_width, args.target_heads, args.seq_len)
        LOG.info("target: %d params at %d layers", n_params(target), args.stages[0][0])
        target, t_stats = train_target(target, train, held_blocks, args)
        t_stats.update(
            layers=args.target_layers,
            width=args.target_width,
            heads=args.target_heads,
            params=n_params(target),
        )
        save(target, tok, t_dir)
    draft = make_model(tok, args.draft_layers, args.draft_width, args.draft_heads, args.seq_len)
    init_draft_from_target(draft, target)
    LOG.info("draft: %d params", n_params(draft))
    d_stats = distil_draft(draft, target, train, held_blocks, args)
    d_stats.update(
        layers=args.draft_layers, width=args.draft_width, heads=args.draft_heads, params=n_params(draft)
    )
    save(draft, tok, args.out / "draft")
    keys = (
        "seq_len",
        "target_stages",
        "target_steps",
        "grow_lr_scale",
        "target_batch",
        "draft_steps",
        "draft_batch",
        "lr",
        "draft_lr",
        "ce_weight",
        "bf16",
        "seed",
    )
    training = {k: getattr(args, k) for k in keys}
    training.update(
        train_tokens=len(train), heldout_tokens=len(held), total_minutes=(time.perf_counter() - t_start) / 60
    )
    LOG.info("training done in %.1f min: target %s, draft %s", training["total_minutes"], t_stats, d_stats)
    return dict(
        target=t_stats,
        draft=d_stats,
        training=training,
        vocab_size=len(tok),
        heldout=[p.name for p in held_files],
        python=sysconfig.get_python_version(),
        command=" ".join([".venv/bin/python", "scripts/train_demo_pair.py", *sys.argv[1:]]),
    )


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = logging.FileHandler(args.out / "train.log", mode="a" if args.eval_only else "w")
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        handlers=[logging.StreamHandler(), log_file],
    )
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    LOG.info("args: %s", vars(args))
    train_files, held_files = split_stdlib(args.holdout_files)
    LOG.info("stdlib: %d train files, held out: %s", len(train_files), [p.name for p in held_files])
    prompts = extract_prompts(held_files, args.n_prompts)
    args.prompts_out.parent.mkdir(parents=True, exist_ok=True)
    args.prompts_out.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    LOG.info("wrote %d prompts to %s", len(prompts), args.prompts_out)
    metrics_path = args.out / "metrics.json"
    if args.eval_only:
        metrics = json.loads(metrics_path.read_text())
    else:
        metrics = train_pair(args, train_files, held_files)
        metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    torch.set_num_threads(args.bench_threads)
    metrics["eval"] = bench(args.out / "target", args.out / "draft", prompts, args)
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    write_model_card(args.out, metrics)
    LOG.info("wrote %s and %s", metrics_path, args.out / "README.md")


if __name__ == "__main__":
    main()
