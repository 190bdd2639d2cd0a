"""How far batched verification's logits are from plain greedy decoding's, and how close the
nearest tie came: the evidence behind "token-identical" for worker/batched.py.

    .venv/bin/python bench/batched_exactness.py --target models/demo/target --draft models/demo/draft

For every token a row keeps, the logits the batched verify pass computed for it are compared with
the logits transformers' plain greedy ``generate`` (batch 1) computed for the same position. The
argmax can differ only where the reference's top-2 margin is below the deviation, so the table
gives the largest deviation and the smallest margins met, and counts positions where
margin < 10 × the largest deviation (the danger zone), plus rows whose tokens differ.
"""

from __future__ import annotations

import argparse
import logging
import random
import sysconfig
from pathlib import Path

import torch

from genjob.generation import batched
from genjob.generation.batched import BatchRequest, speculative_decode_batch
from genjob.generation.loading import load_model, load_tokenizer

log = logging.getLogger("bench.batched_exactness")


def generate_logits(
    target, prompt: list[int], max_new: int, *, draft=None, gamma: int = 0
) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy ``generate``, batch 1: plain, or assisted by ``draft`` with constant γ;
    the new tokens and the target's logits of each, (n, V)."""
    assisted = {}
    if draft is not None:
        config = draft.generation_config
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = gamma, "constant"
        config.assistant_confidence_threshold = 0.0
        assisted = {"assistant_model": draft}
    ids = torch.tensor([prompt])
    out = target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
        **assisted,
    )
    return out.sequences[0, len(prompt) :].tolist(), torch.cat(out.logits)


def prefill_logits(target, prompt: list[int]) -> torch.Tensor:
    """The logits ``batched.prefill`` computes for a prompt's first new token, (1, V)."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = target(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=torch.arange(len(prompt))[None],
            use_cache=True,
            logits_to_keep=1,
            **{batched.cache_kwarg(target): batched.DynamicCache(config=target.config)},
        )
    return out.logits[:, -1]


def recording_verify(records: list):
    """batched.verify that also keeps (row keys, row positions, inputs, logits) of every call."""

    def verify(target, batch, drafts, max_positions):
        tokens = torch.cat([batch.pending[:, None], drafts], 1)
        logits = batched.forward_step(target, batch.caches[0], batch.lengths, tokens, max_positions)
        keys = [row.request.key for row in batch.rows]
        starts = [len(row.tokens) for row in batch.rows]  # index of the pending token in the output
        records.append((keys, starts, tokens, logits))
        return logits.argmax(-1)

    return verify


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--draft-tokens", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text", action="store_true", help="stdlib source lines instead of random ids")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    target, draft = load_model(args.target), load_model(args.draft)
    rng = random.Random(args.seed)
    if args.text:  # line starts of stdlib files the demo pair was not trained on
        tokenizer = load_tokenizer(args.target)
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        lines = [
            line.strip()
            for name in ("inspect.py", "optparse.py", "socketserver.py", "heapq.py")
            for line in (stdlib / name).read_text(encoding="utf-8").splitlines()
            if len(line.strip()) > 12
        ]
        prompts = [
            tokenizer(line)["input_ids"][: rng.randint(4, 40)] for line in rng.sample(lines, args.prompts)
        ]
    else:
        vocab = target.config.vocab_size
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 40))] for _ in range(args.prompts)]
    requests = [
        BatchRequest(key=i, input_ids=p, max_new_tokens=args.max_new_tokens) for i, p in enumerate(prompts)
    ]

    records: list = []
    original, batched.verify = batched.verify, recording_verify(records)
    try:
        with torch.inference_mode():
            results = dict(
                speculative_decode_batch(
                    target, draft, requests, batch_size=args.batch_size, draft_tokens=args.draft_tokens
                )
            )
    finally:
        batched.verify = original

    with torch.inference_mode():
        references = [generate_logits(target, p, args.max_new_tokens) for p in prompts]
        hf_assisted = [
            generate_logits(target, p, args.max_new_tokens, draft=draft, gamma=args.draft_tokens)
            for p in prompts
        ]
    ours_dev, margins = [], []
    for keys, starts, inputs, logits in records:
        for row, (key, start) in enumerate(zip(keys, starts, strict=True)):
            out, ref = results[key].token_ids, references[key][1]
            for j in range(inputs.shape[1]):
                index = start + j  # output index this position predicts
                if index >= len(out) or out[start - 1 : index] != inputs[row, : j + 1].tolist():
                    break  # inputs no longer follow the kept sequence
                ours_dev.append(float((logits[row, j] - ref[index]).abs().max()))
                top = ref[index].topk(2).values
                margins.append(float(top[0] - top[1]))
    hf_dev = [
        float((logits[: len(ref)] - ref[: len(logits)]).abs().max(-1).values.max())
        for (_, logits), (_, ref) in zip(hf_assisted, references, strict=True)
    ]
    prefill_equal = sum(
        torch.equal(prefill_logits(target, prompt), ref[:1])
        for prompt, (_, ref) in zip(prompts, references, strict=True)
    )
    differ_ours = sum(results[key].token_ids != tokens for key, (tokens, _) in enumerate(references))
    differ_hf = sum(a != b for (a, _), (b, _) in zip(hf_assisted, references, strict=True))
    worst = max(max(ours_dev), max(hf_dev))
    smallest = torch.tensor(margins).sort().values
    print()
    print(
        f"{len(prompts)} prompts, {args.max_new_tokens} new tokens each, γ {args.draft_tokens}; "
        f"prefill logits bit-equal to generate's: {prefill_equal}/{len(prompts)}"
    )
    print()
    print("| decoding | max abs logit deviation from plain greedy | rows not token-identical |")
    print("|---|---:|---:|")
    print(f"| ours, B={args.batch_size} ({len(ours_dev)} positions) | {max(ours_dev):.2e} | {differ_ours} |")
    print(f"| HF assisted, batch 1 | {max(hf_dev):.2e} | {differ_hf} |")
    print()
    print(
        f"reference top-2 margins at those positions: smallest {smallest[0]:.2e}, 5th smallest "
        f"{smallest[min(4, len(smallest) - 1)]:.2e}, {int((smallest < 10 * worst).sum())} below 10× the "
        f"largest deviation ({10 * worst:.1e})"
    )


if __name__ == "__main__":
    main()
