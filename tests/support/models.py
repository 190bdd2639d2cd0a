"""Tiny target/draft pairs with random weights, built on disk and loaded by path like real models; a model
in a Hugging Face cache as a download leaves it.

Untied embeddings: random GPT-2s with tied embeddings repeat their last token and agree almost
always, which would hide every disagreement path in the engine.
"""

from __future__ import annotations

import hashlib
import shutil
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from tokenizers import decoders as tk_decoders
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

EOS = "<|endoftext|>"


def corpus_lines(limit_bytes: int = 200_000) -> list[str]:
    """Real text available offline: a slice of the standard library's source."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = ""
    for name in ("textwrap.py", "string.py", "fnmatch.py", "shlex.py", "bisect.py", "heapq.py"):
        text += (stdlib / name).read_text(encoding="utf-8")
        if len(text) > limit_bytes:
            break
    return text.splitlines()


def build_tokenizer(vocab_size: int = 384) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk_decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS, pad_token=EOS, unk_token=EOS
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast, *, n_layer: int, n_embd: int, seed: int, tied: bool = False
) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=512,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=max(1, n_embd // 32),
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=tied,
    )
    return GPT2LMHeadModel(config).eval()


def save_pair(directory: Path, *, vocab_size: int = 384) -> tuple[Path, Path]:
    """Write ``target/`` (2 layers, d=64) and ``draft/`` (1 layer, d=32) with a shared tokenizer."""
    tokenizer = build_tokenizer(vocab_size)
    paths = []
    for name, layers, width, seed in (("target", 2, 64, 1), ("draft", 1, 32, 2)):
        path = directory / name
        build_model(tokenizer, n_layer=layers, n_embd=width, seed=seed).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]


# A minimal chat template for tests (the tiny tokenizer has none of its own).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def with_chat_template(model: Path, directory: Path, template: str = CHAT_TEMPLATE) -> Path:
    """A copy of the model at ``model`` whose tokenizer has ``template`` as its chat template."""
    shutil.copytree(model, directory)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(directory)
    return directory


def cache_hub_model(cache: Path, repo_id: str) -> Path:
    """``repo_id`` in the Hugging Face cache ``cache`` as a download leaves it (refs/main naming a
    snapshot with a config.json); returns the snapshot."""
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text("{}", encoding="utf-8")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit, encoding="utf-8")
    return snapshot
