"""Train a small target/draft GPT-2 pair on the Python stdlib for assisted-generation demos (CPU, offline).

Data: the whole stdlib, recursive, minus test suites, prose and generated tables, with files held out by
the rule in ``scripts/heldout_prompts.py`` (md5 of the relative path, plus the old pair's 8 held-out files).
Each module is cut into documents, one per top-level ``def``/``class`` (with its decorators and the comments
right above it) and one per run of other top-level statements; every document ends with EOS, so greedy
decoding learns to stop after a definition instead of looping. Exact duplicate documents are dropped.

A byte-level BPE tokenizer and a target GPT-2 are trained from scratch; the target grows by progressive
stacking (a shallow wide model takes most of the steps, then it is deepened function-preservingly and
trained on under one global cosine schedule) so that it is deep enough for a cheap 1-layer draft; then a
short sequence-level unlikelihood fine-tune penalises the n-gram repeats of its own greedy continuations
(``--resume-target`` runs only that and what follows, on the saved stacked target). The draft
starts from the target's embeddings and first block and is distilled from it (KL on the target's logits +
a little CE). Both are saved as fp16 safetensors with the tokenizer; the held-out prompt files are
rewritten; then ``demo_pair_eval.py`` measures held-out loss, loops, EOS rate, c and α and writes the card.

    .venv/bin/python scripts/train_demo_pair.py --out models/demo [--eval-only] [--baseline OLD_PAIR_DIR]
"""

from __future__ import annotations

import os

# Set before torch loads OpenMP: with spinning (active) waits, threads on a shared 2-core box crawl.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("RAYON_NUM_THREADS", "1")  # the tokenizer trainer: one core, like torch

import argparse
import ast
import copy
import itertools
import json
import logging
import math
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from demo_pair_eval import EOS, OLD_CTX, PAD, evaluate, write_model_card
from heldout_prompts import STDLIB, legacy_files, stdlib_split, write_prompt_files
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
)

LOG = logging.getLogger("train_demo_pair")
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


# ----------------------------------------------------------------------------- data
def documents(src: str) -> list[str]:
    """A module cut into top-level pieces: each def/class (from its decorators and the comment lines right
    above it) is one piece, the statements between two of them another; each ends with one newline."""
    lines = src.splitlines(keepends=True)
    cuts = {0, len(lines)}
    for node in ast.parse(src).body:
        if isinstance(node, DEFS):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            cuts |= {start, node.end_lineno}
    edges = sorted(cuts)
    pieces = ("".join(lines[a:b]).strip("\n") for a, b in itertools.pairwise(edges))
    return [p + "\n" for p in pieces if p.strip()]


def corpus(files: list[Path]) -> tuple[list[str], int]:
    """Documents of ``files`` in file order, exact duplicates dropped; also the number dropped."""
    seen: set[str] = set()
    docs: list[str] = []
    total = 0
    for path in files:
        for doc in documents(path.read_text(encoding="utf-8", errors="replace")):
            total += 1
            if doc not in seen:
                seen.add(doc)
                docs.append(doc)
    return docs, total - len(docs)


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
    """One flat token stream; every text (document or file) is followed by EOS."""
    ids: list[int] = []
    for enc in tok(texts, add_special_tokens=False)["input_ids"]:
        ids += [*enc, tok.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


def random_batch(data: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(data) - seq_len, (batch,), generator=gen)
    return torch.stack([data[s : s + seq_len] for s in starts.tolist()])


# ----------------------------------------------------------------------------- models
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


# ----------------------------------------------------------------------------- training
def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine from ``peak`` down to 0.1 x ``peak`` at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
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
    lr: Callable[[int], float],
    args: argparse.Namespace,
    name: str,
    on_eval: Callable[[], str],
) -> list[float]:
    """AdamW with the step -> lr schedule ``lr``; ``loss_fn`` maps a token batch to a scalar loss."""
    gen = torch.Generator().manual_seed(args.seed + sum(map(ord, name)))
    opt = torch.optim.AdamW(model.parameters(), lr=lr(0), betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    curve: list[float] = []
    t0 = time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr(step)
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


def train_target(
    target: GPT2LMHeadModel, train: torch.Tensor, held: torch.Tensor, args: argparse.Namespace
) -> tuple[GPT2LMHeadModel, dict[str, Any]]:
    """Progressive stacking under one global warmup + cosine schedule: train a shallow model, deepen it
    (function-preserving), train on, ...; after each deepening a fresh AdamW re-warms (``regrow_warmup``)."""
    t0, curve, stage_eval, stage_minutes, done = time.perf_counter(), [], {}, {}, 0
    for i, (layers, steps) in enumerate(args.stages):
        t_stage = time.perf_counter()
        if layers != target.config.n_layer:
            before = eval_loss(target, held)
            target = grow(target, layers)
            LOG.info(
                "grew target to %d layers: held-out loss %.4f -> %.4f",
                layers,
                before,
                eval_loss(target, held),
            )

        def lr(step: int, offset: int = done, rewarm: int = args.regrow_warmup if i else 1) -> float:
            return lr_at(offset + step, args.target_steps, args.lr, args.warmup) * min(
                1.0, (step + 1) / rewarm
            )

        model = target
        curve = train_loop(
            model,
            lambda x, m=model: m(x, labels=x).loss,
            train,
            steps,
            args.target_batch,
            lr,
            args,
            f"target-L{layers}",
            lambda m=model: f"eval {eval_loss(m, held):.4f}",
        )
        done += steps
        stage_eval[f"L{layers}"] = round(eval_loss(target, held), 4)
        stage_minutes[f"L{layers}"] = round((time.perf_counter() - t_stage) / 60, 2)
    stats = dict(train_loss=statistics.fmean(curve[-args.log_every :]), eval_loss=stage_eval[f"L{layers}"])
    minutes = (time.perf_counter() - t0) / 60
    return target, dict(stats, stage_eval=stage_eval, stage_minutes=stage_minutes, minutes=minutes)


def repeat_mask(seq: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """(B, T) bool: position t >= ``start`` whose n-gram ending at t already occurred earlier in its row."""
    mask = torch.zeros_like(seq, dtype=torch.bool)
    for b, row in enumerate(seq.tolist()):
        seen = {tuple(row[i - n + 1 : i + 1]) for i in range(n - 1, start)}
        for t in range(max(start, n - 1), len(row)):
            gram = tuple(row[t - n + 1 : t + 1])
            mask[b, t] = gram in seen
            seen.add(gram)
    return mask


@torch.no_grad()
def greedy_batch(model: GPT2LMHeadModel, prefix: torch.Tensor, n_new: int) -> torch.Tensor:
    """Greedy continuation of equal-length prefixes (no padding needed), with a KV cache."""
    model.eval()
    cache, seq, x = DynamicCache(), prefix, prefix
    for _ in range(n_new):
        nxt = model(x, past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
        seq, x = torch.cat([seq, nxt], 1), nxt
    model.train()
    return seq


def unlikelihood_finetune(
    target: GPT2LMHeadModel, train: torch.Tensor, held: torch.Tensor, args: argparse.Namespace
) -> dict[str, Any]:
    """Sequence-level unlikelihood (Welleck et al. 2019) against greedy loops: each step the target greedily
    continues ``ul_batch`` random training prefixes by ``ul_new`` tokens; every continuation token that
    completes an n-gram (``ul_ngram``) already in prefix + continuation gets -log(1 - p); plus the usual
    LM loss on ``ul_mle_batch`` training blocks so the model stays a language model."""
    gen = torch.Generator().manual_seed(args.seed + 7)
    opt = torch.optim.AdamW(target.parameters(), lr=args.ul_lr, betas=(0.9, 0.95), weight_decay=0.1)
    t0, flagged, before = time.perf_counter(), [], eval_loss(target, held)
    target.train()
    for step in range(args.ul_steps):
        for group in opt.param_groups:
            group["lr"] = args.ul_lr * min(1.0, (step + 1) / args.regrow_warmup)
        prefix = random_batch(train, args.ul_batch, args.ul_prefix, gen)
        seq = greedy_batch(target, prefix, args.ul_new)
        mask = repeat_mask(seq, args.ul_prefix, args.ul_ngram)[:, 1:]
        x = random_batch(train, args.ul_mle_batch, args.seq_len, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logp = F.log_softmax(target(seq).logits[:, :-1].float(), -1)
            p_tok = logp.gather(-1, seq[:, 1:, None])[..., 0].exp()
            ul = -(torch.log1p(-p_tok.clamp(max=1 - 1e-5)) * mask).sum() / (args.ul_batch * args.ul_new)
            loss = args.ul_weight * ul + target(x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        flagged.append(mask.float().sum().item() / (args.ul_batch * args.ul_new))
        if (step + 1) % args.log_every == 0 or step + 1 == args.ul_steps:
            msg = (
                f" eval {eval_loss(target, held):.4f}"
                if (step + 1) % 50 == 0 or step + 1 == args.ul_steps
                else ""
            )
            LOG.info(
                "unlikelihood step %d/%d loss %.4f ul %.4f repeated-%d-gram share of greedy tokens %.3f "
                "%.0fs%s",
                step + 1,
                args.ul_steps,
                loss.item(),
                ul.item(),
                args.ul_ngram,
                statistics.fmean(flagged[-args.log_every :]),
                time.perf_counter() - t0,
                msg,
            )
    target.eval()
    return dict(
        eval_before=before,
        eval_after=eval_loss(target, held),
        repeated_share_first=statistics.fmean(flagged[: args.log_every]),
        repeated_share_last=statistics.fmean(flagged[-args.log_every :]),
        minutes=(time.perf_counter() - t0) / 60,
    )


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

    def lr(step: int) -> float:
        return lr_at(step, args.draft_steps, args.draft_lr, args.warmup)

    curve = train_loop(draft, loss_fn, train, args.draft_steps, args.draft_batch, lr, args, "draft", report)
    return dict(
        train_loss=statistics.fmean(curve[-args.log_every :]),
        eval_loss=eval_loss(draft, held),
        agreement=agreement(draft, target, held),
        minutes=(time.perf_counter() - t0) / 60,
    )


# ----------------------------------------------------------------------------- CLI
OPTIONS: dict[str, tuple[Any, str]] = {  # --flag: (default, help)
    "seed": (1234, ""),
    "threads": (1, "torch threads for training (the box is shared: one)"),
    "vocab_size": (2048, "BPE vocab"),
    "seq_len": (512, "block = n_positions"),
    "target_stages": ("4:1900,8:320,24:120", "progressive stacking, layers:steps,... (last = target depth)"),
    "target_width": (256, ""),
    "target_heads": (4, ""),
    "target_batch": (16, ""),
    "lr": (3e-3, "target peak lr (one warmup + cosine over all stages)"),
    "regrow_warmup": (30, "steps to re-warm the fresh optimizer after each deepening"),
    "ul_steps": (150, "unlikelihood fine-tuning steps after stacking (0: none)"),
    "ul_batch": (8, "greedy continuations per unlikelihood step"),
    "ul_prefix": (64, "their training-text prefix length"),
    "ul_new": (48, "their length"),
    "ul_ngram": (4, "a continuation token completing an n-gram seen before is penalised"),
    "ul_weight": (1.0, ""),
    "ul_mle_batch": (4, "LM-loss blocks per unlikelihood step"),
    "ul_lr": (3e-4, ""),
    "draft_layers": (1, ""),
    "draft_width": (256, "= target width to start from its layers"),
    "draft_heads": (4, ""),
    "draft_steps": (400, ""),
    "draft_batch": (8, ""),
    "draft_lr": (3e-3, ""),
    "ce_weight": (0.1, "CE weight next to the KL when distilling"),
    "warmup": (50, "lr warmup steps"),
    "eval_blocks": (16, "held-out blocks (legacy files) scored during training"),
    "log_every": (10, ""),
    "eval_every": (100, ""),
    "max_new_tokens": (64, "evaluation: new tokens per held-out prompt"),
    "temperature": (0.8, "evaluation: sampled runs"),
    "gamma": (5, "evaluation: draft tokens per round for the acceptance rate"),
    "bench_threads": (1, "tiny models gain nothing from 2"),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("models/demo"))
    p.add_argument("--prompts-out", type=Path, default=Path("bench/prompts/heldout.jsonl"))
    p.add_argument("--examples-out", type=Path, default=Path("examples/prompts.jsonl"))
    p.add_argument("--baseline", type=Path, help="an older pair's dir (target/, draft/) to compare with")
    p.add_argument("--eval-only", action="store_true", help="only evaluate the saved pair")
    p.add_argument("--skip-target", action="store_true", help="reuse the saved target, re-distil the draft")
    p.add_argument(
        "--resume-target",
        action="store_true",
        help="take the saved target as the stacking stages' output: unlikelihood fine-tune it, re-distil",
    )
    p.add_argument("--no-bf16", dest="bf16", action="store_false", help="train in fp32, not bf16 autocast")
    for key, (default, help_text) in OPTIONS.items():
        p.add_argument(f"--{key.replace('_', '-')}", type=type(default), default=default, help=help_text)
    args = p.parse_args()
    args.stages = [tuple(map(int, stage.split(":"))) for stage in args.target_stages.split(",")]
    args.target_layers, args.target_steps = args.stages[-1][0], sum(n for _, n in args.stages)
    return args


def train_pair(args: argparse.Namespace, train_files: list[Path], held_files: list[Path]) -> dict[str, Any]:
    t_start, t_dir = time.perf_counter(), args.out / "target"
    docs, dups = corpus(train_files)
    legacy = [p.read_text(encoding="utf-8") for p in legacy_files()]
    if args.skip_target or args.resume_target:
        tok = AutoTokenizer.from_pretrained(t_dir)
        target = AutoModelForCausalLM.from_pretrained(t_dir, dtype=torch.float32)
        t_stats = json.loads((args.out / "metrics.json").read_text())["target"]
    else:
        tok = build_tokenizer(docs, args.vocab_size, args.seq_len)
    train, held = encode(tok, docs), encode(tok, legacy)
    n_blocks = min(args.eval_blocks, len(held) // args.seq_len)
    stride = len(held) // n_blocks  # blocks spread over all 8 files, not just the first
    held_blocks = torch.stack([held[i * stride : i * stride + args.seq_len] for i in range(n_blocks)])
    n_bytes = sum(len(d.encode()) for d in docs)
    LOG.info(
        "tokenizer vocab %d; %d documents (%d duplicates dropped), %d train tokens, %.2f bytes/token; "
        "%d tokens in the 8 legacy held-out files (%d blocks scored during training), %.1f min",
        len(tok),
        len(docs),
        dups,
        len(train),
        n_bytes / len(train),
        len(held),
        n_blocks,
        (time.perf_counter() - t_start) / 60,
    )
    if not (args.skip_target or args.resume_target):
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
        target = target.to(torch.float16).float()  # as --resume-target would load it
    if args.ul_steps and not args.skip_target:
        t_stats["unlikelihood"] = unlikelihood_finetune(target, train, held_blocks, args)
        t_stats["eval_loss"] = t_stats["unlikelihood"]["eval_after"]
        save(target, tok, t_dir)
    draft = make_model(tok, args.draft_layers, args.draft_width, args.draft_heads, args.seq_len)
    init_draft_from_target(draft, target)
    LOG.info("draft: %d params", n_params(draft))
    d_stats = distil_draft(draft, target, train, held_blocks, args)
    d_stats.update(
        layers=args.draft_layers, width=args.draft_width, heads=args.draft_heads, params=n_params(draft)
    )
    gc = draft.generation_config  # defaults for target.generate(assistant_model=draft); genjob sets its own
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = (
        args.gamma,
        "constant",
        0.0,
    )
    save(draft, tok, args.out / "draft")
    training = {k: getattr(args, k) for k in (*OPTIONS, "target_steps", "bf16")}  # every setting
    training.update(
        train_files=len(train_files),
        heldout_files=len(held_files),
        train_documents=len(docs),
        duplicate_documents=dups,
        train_tokens=len(train),
        train_bytes=n_bytes,
        target_tokens_seen=args.target_steps * args.target_batch * args.seq_len,
        resumed_target=args.resume_target,
        total_minutes=(time.perf_counter() - t_start) / 60
        + (t_stats["minutes"] if args.resume_target else 0),
    )
    LOG.info("training done in %.1f min: target %s, draft %s", training["total_minutes"], t_stats, d_stats)
    return dict(
        target=t_stats,
        draft=d_stats,
        training=training,
        vocab_size=len(tok),
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
    train_files, held_files, skipped = stdlib_split()
    rel = [p.relative_to(STDLIB).as_posix() for p in held_files]
    LOG.info(
        "stdlib: %d train files, %d skipped, %d held out: %s", len(train_files), len(skipped), len(rel), rel
    )
    metrics_path = args.out / "metrics.json"
    if args.eval_only:
        metrics = json.loads(metrics_path.read_text())
    else:
        old = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
        metrics = train_pair(args, train_files, held_files)
        if (args.resume_target or args.skip_target) and "baseline" in old:  # same tokenizer, same prompts
            metrics["baseline"] = old["baseline"]
        if args.resume_target and "eval" in old:  # the stacked pair's results, before unlikelihood
            keys = ("loss_legacy8", "greedy", "sampled", "alpha", "acceptance_rate", "c")
            metrics["eval_before_unlikelihood"] = {k: old["eval"][k] for k in keys}
        metrics["heldout_files"] = rel
        metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    tok = AutoTokenizer.from_pretrained(args.out / "target")
    prompts = write_prompt_files(tok, args.prompts_out, args.examples_out)
    LOG.info("wrote %d prompts to %s (and %s)", len(prompts), args.prompts_out, args.examples_out)
    torch.set_num_threads(args.bench_threads)
    metrics["eval"] = evaluate(args.out, prompts, args)
    if args.baseline:  # on the prompts that fit the old context with the new tokenizer too
        n_max = OLD_CTX - args.max_new_tokens
        fits = [p for p in prompts if len(tok(p["prompt"], add_special_tokens=False)["input_ids"]) <= n_max]
        metrics["baseline"] = evaluate(args.baseline, fits, args, baseline=True)
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    write_model_card(args.out, metrics)
    LOG.info("wrote %s and %s", metrics_path, args.out / "README.md")


if __name__ == "__main__":
    main()
