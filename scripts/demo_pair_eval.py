"""Evaluation and model card of the demo pair (``scripts/train_demo_pair.py`` calls this after training, or
alone with ``--eval-only``; ``--baseline DIR`` also scores an older pair the same way).

On held-out data only: loss on the 8 legacy held-out stdlib files (nats/token and nats/byte, so that pairs
with different tokenizers compare) and on all held-out stdlib files; on the prompts of
``bench/prompts/heldout.jsonl`` with 64 new tokens: the repeated-3-gram fraction of the target's greedy and
T=0.8 outputs, the EOS rate, α (draft argmax == the target's greedy token, teacher-forced on the target's
greedy outputs) and the acceptance rate of a minimal greedy speculative loop (γ draft tokens per round);
and the cost ratio c = draft / target time of a 1-token forward on a 100-token cache. Everything goes to
``metrics.json`` and the pair's README.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from heldout_prompts import legacy_files, length_summary, stdlib_split
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, GPT2LMHeadModel

EOS, PAD = "<|endoftext|>", "<|pad|>"  # the tokenizer's special tokens
OLD_CTX = 256  # the old pair's context: its comparisons use the prompts that fit it with 64 new tokens


# ----------------------------------------------------------------------------- measurements
@torch.inference_mode()
def forward_ms(model: GPT2LMHeadModel, ctx: int, k: int, reps: int = 100) -> float:
    """Median time of a ``k``-token forward on top of a ``ctx``-token DynamicCache."""
    cache = DynamicCache()
    model(torch.randint(2, model.config.vocab_size, (1, ctx)), past_key_values=cache, use_cache=True)
    x, times = torch.randint(2, model.config.vocab_size, (1, k)), []
    for _ in range(reps):
        t0 = time.perf_counter()
        model(x, past_key_values=cache, use_cache=True)
        times.append(time.perf_counter() - t0)
        cache.crop(-k)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def speculative_generate(
    target: GPT2LMHeadModel, draft: GPT2LMHeadModel, ids: list[int], gamma: int, max_new: int, eos_id: int
) -> tuple[list[int], int, int]:
    """Minimal greedy speculative decoding. Returns (new tokens, proposed, accepted draft tokens).

    Invariant after each round: both caches hold at most ``seq[:-1]``; the next forward feeds the rest.
    """
    seq, n0 = list(ids), len(ids)
    t_cache, d_cache = DynamicCache(), DynamicCache()
    proposed = accepted = 0
    while len(seq) - n0 < max_new:
        g = min(gamma, max_new - (len(seq) - n0) - 1)
        drafts: list[int] = []
        inp = seq[d_cache.get_seq_length() :]
        for _ in range(g):
            logits = draft(torch.tensor([inp]), past_key_values=d_cache, use_cache=True).logits
            inp = [int(logits[0, -1].argmax())]
            drafts += inp
        t_in = seq[t_cache.get_seq_length() :] + drafts
        pred = target(torch.tensor([t_in]), past_key_values=t_cache, use_cache=True).logits[0, -(g + 1) :]
        pred = pred.argmax(-1).tolist()
        k = 0
        while k < g and pred[k] == drafts[k]:
            k += 1
        new = [*drafts[:k], pred[k]]
        proposed, accepted = proposed + g, accepted + k
        if eos_id in new:
            seq += new[: new.index(eos_id) + 1]
            break
        seq += new
        for cache in (t_cache, d_cache):
            extra = cache.get_seq_length() - (len(seq) - 1)
            if extra > 0:
                cache.crop(-extra)
    return seq[n0:], proposed, accepted


def repeated_3grams(prompt: list[int], out: list[int]) -> int:
    """Output tokens x_t whose 3-gram (x_{t-2}, x_{t-1}, x_t), over prompt + output, occurred earlier."""
    seq, seen, rep = prompt + out, set(), 0
    for t in range(2, len(seq)):
        gram = tuple(seq[t - 2 : t + 1])
        rep += t >= len(prompt) and gram in seen
        seen.add(gram)
    return rep


def item(prompt: list[int], out: list[int], eos: int) -> dict[str, int]:
    """Per-item counts; the generated tokens are those before EOS (EOS itself is not counted)."""
    ended = eos in out
    gen = out[: out.index(eos)] if ended else out
    return dict(n=len(prompt), gen=len(gen), rep=repeated_3grams(prompt, gen), eos=int(ended))


def aggregate(items: list[dict[str, int]]) -> dict[str, float]:
    gen = sum(x["gen"] for x in items)
    return dict(
        items=len(items),
        rep3=sum(x["rep"] for x in items) / max(1, gen),
        rep3_item_mean=statistics.fmean(x["rep"] / max(1, x["gen"]) for x in items),
        eos_rate=statistics.fmean(x["eos"] for x in items),
        eos_items=sum(x["eos"] for x in items),
        mean_gen_tokens=gen / len(items),
    )


@torch.inference_mode()
def file_loss(model: GPT2LMHeadModel, tok, files: list[Path]) -> dict[str, float]:
    """Each file + EOS, one stream, non-overlapping windows of the model's context; nats/token and
    nats/byte (bytes: UTF-8 of the files' text)."""
    texts = [p.read_text(encoding="utf-8") for p in files]
    ids = []
    for t in texts:
        ids += tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids_t, ctx, nats, n = torch.tensor(ids), model.config.n_positions, 0.0, 0
    for s in range(0, len(ids) - 1, ctx):
        block = ids_t[s : s + ctx + 1]  # ctx inputs predict the next ctx tokens (last window shorter)
        logits = model(block[None, :-1]).logits[0].float()
        nats += torch.nn.functional.cross_entropy(logits, block[1:], reduction="sum").item()
        n += len(block) - 1
    n_bytes = sum(len(t.encode()) for t in texts)
    return dict(tokens=n, bytes=n_bytes, nats_per_token=nats / n, nats_per_byte=nats / n_bytes)


def subsets(prompts: list[dict[str, Any]], items: list[dict[str, int]], n_new: int) -> dict[str, Any]:
    """Aggregates over all prompts, the ones that fit the old pair's context, stdlib and third-party."""
    pick = {
        "all": lambda p, x: True,
        f"fits{OLD_CTX}": lambda p, x: x["n"] + n_new <= OLD_CTX,
        "stdlib": lambda p, x: p["id"].startswith("stdlib:"),
        "third_party": lambda p, x: not p["id"].startswith("stdlib:"),
    }
    return {
        k: aggregate([x for p, x in zip(prompts, items, strict=True) if f(p, x)])
        for k, f in pick.items()
        if any(f(p, x) for p, x in zip(prompts, items, strict=True))
    }


def evaluate(
    pair: Path, prompts: list[dict[str, Any]], args: argparse.Namespace, baseline: bool = False
) -> dict[str, Any]:
    """All held-out measurements of the pair in ``pair`` (target/, draft/)."""
    import logging

    log = logging.getLogger("train_demo_pair")
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(pair / "target")
    target = AutoModelForCausalLM.from_pretrained(pair / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(pair / "draft", dtype=torch.float32).eval()
    eos, pad, n_new, ctx = tok.eos_token_id, tok.pad_token_id, args.max_new_tokens, target.config.n_positions
    res: dict[str, Any] = dict(pair=str(pair), n_positions=ctx, vocab_size=len(tok))
    res["loss_legacy8"] = file_loss(target, tok, legacy_files())
    res["draft_loss_legacy8"] = file_loss(draft, tok, legacy_files())
    if not baseline:
        res["loss_all_heldout"] = file_loss(target, tok, stdlib_split()[1])
    log.info("%s: loss on the 8 legacy files %s (%.0fs)", pair, res["loss_legacy8"], time.perf_counter() - t0)

    enc = [tok(p["prompt"], add_special_tokens=False)["input_ids"] for p in prompts]
    keep = [i for i, ids in enumerate(enc) if len(ids) + n_new <= ctx]
    prompts, enc = [prompts[i] for i in keep], [enc[i] for i in keep]
    res["prompt_tokens"] = length_summary([len(e) for e in enc])
    if not baseline:  # the source's own continuation: what real code scores (the definition may end)
        ref = []
        for p, ids in zip(prompts, enc, strict=True):
            full = tok(p["prompt"] + p["rest"], add_special_tokens=False)["input_ids"]
            cont = full[len(ids) :][:n_new]
            ref.append(item(ids, cont + ([eos] if len(full) - len(ids) <= n_new else []), eos))
        res["reference"] = subsets(prompts, ref, n_new)

    kw = dict(max_new_tokens=n_new, eos_token_id=eos, pad_token_id=pad, top_k=None)
    greedy, sampled, outs = [], [], []
    with torch.inference_mode():
        for i, ids in enumerate(enc):
            x = torch.tensor([ids])
            out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, **kw)[0, len(ids) :]
            outs.append(out.tolist())
            greedy.append(item(ids, outs[-1], eos))
            torch.manual_seed(args.seed + i)
            out = target.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=True,
                temperature=args.temperature,
                top_p=1.0,
                **kw,
            )[0, len(ids) :]
            sampled.append(item(ids, out.tolist(), eos))
    res["greedy"], res["sampled"] = subsets(prompts, greedy, n_new), subsets(prompts, sampled, n_new)
    res["temperature"], res["max_new_tokens"] = args.temperature, n_new
    log.info(
        "greedy %s; T=%s %s (%.0fs)",
        res["greedy"]["all"],
        args.temperature,
        res["sampled"]["all"],
        time.perf_counter() - t0,
    )

    with torch.inference_mode():  # α: teacher-forced on the target's own greedy continuations
        hits = total = 0
        for ids, out in zip(enc, outs, strict=True):
            full = torch.tensor([ids + out])
            pred = draft(full).logits[0, len(ids) - 1 : -1].argmax(-1)
            hits += int((pred == full[0, len(ids) :]).sum())
            total += len(out)
    res["alpha"] = hits / total
    proposed = accepted = same = 0
    for ids, out in zip(enc, outs, strict=True):
        spec, p, a = speculative_generate(target, draft, ids, args.gamma, n_new, eos)
        proposed, accepted, same = proposed + p, accepted + a, same + (spec == out)
    res.update(gamma=args.gamma, acceptance_rate=accepted / proposed, spec_equals_greedy=same / len(enc))
    t_ms, d_ms = forward_ms(target, 100, 1), forward_ms(draft, 100, 1)
    res.update(target_ms=t_ms, draft_ms=d_ms, c=d_ms / t_ms, threads=torch.get_num_threads())
    res["samples"] = [
        dict(id=p["id"], prompt=p["prompt"], greedy=tok.decode(o))
        for p, o in list(zip(prompts, outs, strict=True))[:: max(1, len(outs) // 4)][:4]
    ]
    res["minutes"] = (time.perf_counter() - t0) / 60
    log.info(
        "%s: alpha %.3f, acceptance rate (gamma %d) %.3f, spec == greedy %.3f, target %.2f ms, "
        "draft %.2f ms, c %.3f (%.1f min)",
        pair,
        res["alpha"],
        args.gamma,
        res["acceptance_rate"],
        res["spec_equals_greedy"],
        t_ms,
        d_ms,
        res["c"],
        res["minutes"],
    )
    for s in res["samples"]:
        log.info("sample %s:\n%s\u2588%s", s["id"], s["prompt"], s["greedy"])
    return res


# ----------------------------------------------------------------------------- model card
def _gen_row(name: str, g: dict[str, float]) -> str:
    return (
        f"| {name} | {g['items']} | {g['rep3']:.3f} | {g['rep3_item_mean']:.3f} | {g['eos_items']}"
        f" ({g['eos_rate']:.0%}) | {g['mean_gen_tokens']:.1f} |"
    )


def write_model_card(out: Path, m: dict[str, Any]) -> None:
    t, d, ev, tr, base = m["target"], m["draft"], m["eval"], m["training"], m.get("baseline")
    size = {
        k: sum(f.stat().st_size for f in (out / k).glob("*.safetensors")) / 2**20 for k in ("target", "draft")
    }
    arch = "\n".join(
        f"| {k} | {x['layers']} | {x['width']} | {x['heads']} | {x['params'] / 1e6:.2f} M"
        f" | {size[k]:.1f} MiB |"
        for k, x in (("target", t), ("draft", d))
    )
    stages = ", ".join(f"L{k[1:]} {v:.3f}" for k, v in t["stage_eval"].items())
    stage_min = ", ".join(f"{k} {v:.1f} min" for k, v in t["stage_minutes"].items())
    new8, fits = ev["loss_legacy8"], f"fits{OLD_CTX}"
    loss_rows = [
        f"| new ({ev['vocab_size']}-token BPE, ctx {ev['n_positions']}) | {new8['tokens']:,} | "
        f"{new8['nats_per_token']:.3f} | {new8['nats_per_byte']:.4f} |"
    ]
    gen_rows = [
        _gen_row(f"new, greedy, {k}", ev["greedy"][k]) for k in ("all", fits, "stdlib", "third_party")
    ]
    gen_rows += [_gen_row(f"new, T={ev['temperature']}, {k}", ev["sampled"][k]) for k in ("all", fits)]
    gen_rows += [
        _gen_row(f"real code (the source's own continuation), {k}", ev["reference"][k]) for k in ("all", fits)
    ]
    cmp = ""
    if base:
        b8 = base["loss_legacy8"]
        loss_rows.insert(
            0,
            f"| old (issue-16 baseline, {base['vocab_size']}-token BPE, ctx {base['n_positions']}) | "
            f"{b8['tokens']:,} | {b8['nats_per_token']:.3f} | {b8['nats_per_byte']:.4f} |",
        )
        gen_rows += [
            _gen_row(f"old, greedy, {fits}", base["greedy"]["all"]),
            _gen_row(f"old, T={base['temperature']}, {fits}", base["sampled"]["all"]),
        ]
        cmp = (
            f"\nOld pair on the same prompts (those fitting its {OLD_CTX}-token context): "
            f"c = {base['c']:.3f}, α = {base['alpha']:.3f}, "
            f"acceptance rate (γ = {base['gamma']}) {base['acceptance_rate']:.3f}.\n"
        )
    g, s = ev["greedy"]["all"], ev["sampled"]["all"]
    size_mib = size["target"] + size["draft"]
    loss_ok = new8["nats_per_token"] < 3.652 and (
        not base or new8["nats_per_byte"] < base["loss_legacy8"]["nats_per_byte"]
    )
    held = ", ".join(m["heldout_files"])
    two_step = ""
    if tr.get("resumed_target"):
        two_step = """
Made in two invocations: first the data, tokenizer and stacking stages (`train.log` starts with that
run, which also distilled and evaluated a draft for the stacked target; that code had no unlikelihood
stage, like `--ul-steps 0`), then the command above. In one go (stacking, unlikelihood, distillation,
evaluation; the target is round-tripped through fp16 after stacking in both paths):

    .venv/bin/python scripts/train_demo_pair.py --out models/demo --baseline /tmp/demo-old/models/demo
"""
    ul, ul_text = t.get("unlikelihood"), ""
    if ul:
        ul_text = f"""
- Then sequence-level unlikelihood fine-tuning against greedy loops (Welleck et al. 2019), {tr["ul_steps"]}
  steps: each step the target greedily continues {tr["ul_batch"]} random {tr["ul_prefix"]}-token training
  prefixes by {tr["ul_new"]} tokens, and every continuation token that completes a {tr["ul_ngram"]}-gram
  already present in prefix + continuation gets -log(1 - p) (weight {tr["ul_weight"]}), next to the LM loss
  on {tr["ul_mle_batch"]} x {tr["seq_len"]} training tokens; AdamW lr {tr["ul_lr"]}. Share of such tokens
  in those greedy continuations: {ul["repeated_share_first"]:.3f} in the first {10} steps,
  {ul["repeated_share_last"]:.3f} in the last; held-out loss (same blocks) {ul["eval_before"]:.3f} ->
  {ul["eval_after"]:.3f}. {ul["minutes"]:.1f} min."""
        pre = m.get("eval_before_unlikelihood")
        if pre:
            ul_text += (
                f" Before this stage the pair scored: greedy repeated-3-gram fraction "
                f"{pre['greedy']['all']['rep3']:.3f}, EOS {pre['greedy']['all']['eos_items']}/"
                f"{pre['greedy']['all']['items']}, T={ev['temperature']} "
                f"{pre['sampled']['all']['rep3']:.3f}, "
                f"loss on the 8 files {pre['loss_legacy8']['nats_per_token']:.3f} nats/token, "
                f"α {pre['alpha']:.3f}, acceptance rate {pre['acceptance_rate']:.3f}."
            )
    all_held = ev["loss_all_heldout"]
    ok = lambda flag: "yes" if flag else "**no**"  # noqa: E731
    samples = "\n\n".join(
        f"`{x['id']}` (prompt, then ▌ and the target's greedy output):"
        f"\n\n```python\n{x['prompt']}▌{x['greedy']}\n```"
        for x in ev["samples"][:2]
    )
    card = f"""# Demo target/draft pair for speculative decoding on CPU

Tiny GPT-2 models trained from scratch, offline, on the Python {m["python"]} standard library. They write
plausible-looking, not correct, Python; trained with EOS after every top-level definition so that greedy
output can stop, and fine-tuned with an unlikelihood loss on their own greedy loops.
Made by `scripts/train_demo_pair.py` (evaluation: `scripts/demo_pair_eval.py`, prompts:
`scripts/heldout_prompts.py`).

## Acceptance (issue 16), held-out prompts, {ev["max_new_tokens"]} new tokens

| check | wanted | got | met |
|---|---|---|---|
| repeated-3-gram fraction, target greedy | ≤ 0.40 | {g["rep3"]:.3f} | {ok(g["rep3"] <= 0.40)} |
| held-out loss, the 8 legacy files | < 3.652 nats/token (old pair) | \
{new8["nats_per_token"]:.3f} nats/token, {new8["nats_per_byte"]:.4f} nats/byte | {ok(loss_ok)} |
| cost ratio c | ≤ 0.1 | {ev["c"]:.3f} | {ok(ev["c"] <= 0.1)} |
| weights, pair together | ≤ 50 MiB | {size_mib:.1f} MiB | {ok(size_mib <= 50)} |
| EOS rate (greedy) | report | {g["eos_items"]}/{g["items"]} ({g["eos_rate"]:.0%}) | |
| repeated-3-gram fraction, T = {ev["temperature"]} | report | \
{s["rep3"]:.3f} (EOS {s["eos_items"]}/{s["items"]}) | |
| α (draft argmax == target greedy token) | report | {ev["alpha"]:.3f} | |
| acceptance rate, γ = {ev["gamma"]} | report | {ev["acceptance_rate"]:.3f} | |

## Models

| dir | layers | width | heads | params | safetensors (fp16) |
|---|---|---|---|---|---|
{arch}

- `GPT2LMHeadModel` (built into transformers, no remote code), tanh-GELU, no dropout, tied embeddings,
  `n_positions` = {tr["seq_len"]}: prompt + new tokens must fit in {tr["seq_len"]} tokens.
- Tokenizer: byte-level BPE trained on the training documents, vocab {m["vocab_size"]}; `{EOS}` is
  bos/eos (id 0), `{PAD}` is pad (id 1), left padding; saved in both directories. It is not the old
  pair's tokenizer, so losses are also given per byte.
- Weights are float16 on disk; `config.json` says float32, so `from_pretrained(path)` and
  `from_pretrained(path, dtype=torch.float32)` both give fp32 CPU models.

## Data and held-out rule

- The stdlib (`sysconfig.get_paths()["stdlib"]`, recursive `*.py`). Skipped: `site-packages`, the test
  suites (`test/`, `*/tests/`, `idlelib/idle_test/`: repetitive assert lists, the very pattern we want
  less of, and not what the prompts look like), `pydoc_data` (prose tables), and generated tables
  (codecs made by `gencodec.py`; files whose non-blank lines are mostly bare literals: `html/entities.py`,
  `_sysconfigdata*`, `locale.py`, ...). Kept: `idlelib`, `lib2to3` (without tests), `distutils`,
  `turtledemo`, `tkinter`, `asyncio`, `email`, ...
- Held out (never trained on, the tokenizer neither): the old pair's 8 files (_collections_abc, crypt,
  heapq, inspect, optparse, pyclbr, runpy, socketserver; kept so losses compare) and every file with
  `int(md5(relative path)[:8], 16) % 32 == 0`: {len(m["heldout_files"])} files, {held}.
- Training: {tr["train_files"]} files cut into {tr["train_documents"]:,} documents — one per top-level
  `def`/`class` (with its decorators and the comments just above it), one per run of other top-level
  statements — each followed by `{EOS}`, so the model learns that a definition ends and greedy output can
  stop; {tr["duplicate_documents"]:,} exact duplicate documents dropped. {tr["train_tokens"]:,} tokens
  ({tr["train_bytes"] / tr["train_tokens"]:.2f} bytes/token).

## Training ({tr["total_minutes"]:.1f} min wall, {tr["threads"]} CPU thread, shared 2-core box)

- Target: progressive stacking `{tr["target_stages"]}` (layers:steps; each deepening repeats every block
  and zeroes the repeat's output projections, so the function is unchanged), one warmup ({tr["warmup"]}
  steps) + cosine schedule over all {tr["target_steps"]} steps (peak lr {tr["lr"]}, down to 0.1x), a fresh
  AdamW re-warmed over {tr["regrow_warmup"]} steps after each deepening; batch {tr["target_batch"]} x
  {tr["seq_len"]} tokens ({tr["target_tokens_seen"] / 1e6:.1f} M tokens seen,
  {tr["target_tokens_seen"] / tr["train_tokens"]:.1f} epochs), bf16 autocast: {tr["bf16"]}, seed
  {tr["seed"]}. {t["minutes"]:.1f} min ({stage_min}); final train loss {t["train_loss"]:.3f};
  held-out loss after each stage on {tr["eval_blocks"]} blocks of the 8 files: {stages}.{ul_text}
- Draft: starts from the target's embeddings, first block and final norm; distilled for
  {tr["draft_steps"]} steps x {tr["draft_batch"]} x {tr["seq_len"]} tokens with KL(target||draft) +
  {tr["ce_weight"]} x CE. {d["minutes"]:.1f} min; held-out CE {d["eval_loss"]:.3f}, top-1 agreement with
  the target {d["agreement"]:.3f} (teacher-forced, held-out text).

## Held-out loss

Every file + EOS as one stream, scored in non-overlapping windows of each model's context. (The old
card's 3.652 nats/token covered only the first 48 x 256 tokens of this stream, i.e. _collections_abc.py,
crypt.py and the start of heapq.py; the table scores all of it, for both pairs.)

| pair | tokens | nats/token | nats/byte |
|---|---|---|---|
{chr(10).join(loss_rows)}

All {len(m["heldout_files"])} held-out stdlib files: {all_held["nats_per_token"]:.3f} nats/token,
{all_held["nats_per_byte"]:.4f} nats/byte ({all_held["tokens"]:,} tokens).
The draft on the 8 files: {ev["draft_loss_legacy8"]["nats_per_token"]:.3f} nats/token.

## Loops and stopping

`bench/prompts/heldout.jsonl`: {ev["greedy"]["all"]["items"]} prompts, token lengths {ev["prompt_tokens"]}.
Repeated-3-gram fraction: an output token x_t counts if (x_{{t-2}}, x_{{t-1}}, x_t), over prompt +
output, already occurred earlier in prompt + output; fraction = repeated / generated tokens, pooled over
prompts (per-prompt mean also given); generated tokens are those before EOS. EOS: the output ends with
EOS within {ev["max_new_tokens"]} tokens. `{fits}`: the prompts with ≤ {OLD_CTX - ev["max_new_tokens"]}
tokens, which the old pair can take. "real code": the source's own next {ev["max_new_tokens"]} tokens
(EOS when the definition ends), a reference for what non-looping code scores.

| outputs | prompts | repeated 3-grams | per-prompt mean | EOS | tokens / prompt |
|---|---|---|---|---|---|
{chr(10).join(gen_rows)}

{samples}

## Speculative decoding

Batch 1, fp32, {ev["threads"]} CPU thread. One forward on a 100-token cache: target {ev["target_ms"]:.2f} ms,
draft {ev["draft_ms"]:.2f} ms, so **c = {ev["c"]:.3f}**. **α = {ev["alpha"]:.3f}** (draft argmax == the
target's greedy token, teacher-forced on the target's greedy outputs of the held-out prompts).
**Acceptance rate {ev["acceptance_rate"]:.3f}** (accepted / proposed draft tokens of a minimal greedy
speculative loop, γ = {ev["gamma"]}; its outputs equal plain greedy on {ev["spec_equals_greedy"]:.0%} of
the prompts).
{cmp}
## Speedup (from bench/engine.py)

*Placeholder: to be filled by the engine benchmark (`bench/engine.py`, being rewritten) at batch sizes
1 and 8 on `bench/prompts/heldout.jsonl`. Speedups against transformers' assisted generation are not the
headline.*

| batch | plain tokens/s | speculative tokens/s | speedup |
|---|---|---|---|
| 1 | TBD | TBD | TBD |
| 8 | TBD | TBD | TBD |

## Reproduce

{tr["total_minutes"]:.1f} min of training on a shared, busy 2-core machine, plus {ev["minutes"]:.1f} min of
evaluation; full log in `train.log`:

    {m["command"]}
{two_step}
`--baseline` points at the old pair, the one of commit 7972bdc, unpacked with
`git archive 7972bdc models/demo | tar -x -C /tmp/demo-old` (`--eval-only --baseline ...` re-evaluates only).
Prompts alone: `.venv/bin/python scripts/heldout_prompts.py`.
"""
    (out / "README.md").write_text(card)
