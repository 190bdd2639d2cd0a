"""A GGUF file made here with the ``gguf`` package's writer (a 2-layer Llama carrying smollm2's tokenizer
metadata): converted once into the model cache under its sha256, loaded as a plain checkpoint, the
second time without converting, with its chat template and EOS."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from genjob.catalog import package_file
from genjob.generation.loading import eos_ids, load_tokenizer
from genjob.generation.model_source import gguf_sha256, local_checkpoint
from genjob.settings import BUILTIN_MODELS

SMOLLM2 = next(entry for entry in BUILTIN_MODELS if entry.name == "smollm2")
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 32, 2, 4, 2, 64
SHAPE = {
    "llama.block_count": LAYERS,
    "llama.context_length": 256,
    "llama.embedding_length": HIDDEN,
    "llama.feed_forward_length": FFN,
    "llama.attention.head_count": HEADS,
    "llama.attention.head_count_kv": KV_HEADS,
    "llama.rope.dimension_count": HIDDEN // HEADS,
    "general.file_type": 0,  # every tensor in float32
}


def write_tiny_gguf(path: Path) -> None:
    """smollm2's metadata (its tokenizer, chat template, EOS) with a tiny model's shape, random weights."""
    source = gguf.GGUFReader(package_file(SMOLLM2.target, name=SMOLLM2.name))
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, field in source.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer's own
        value = SHAPE.get(key, field.contents())
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, field.types[0])
    generator = np.random.default_rng(0)
    vocab, kv = len(source.fields["tokenizer.ggml.tokens"].data), KV_HEADS * (HIDDEN // HEADS)

    def weight(*shape: int) -> np.ndarray:
        return (generator.standard_normal(shape) * 0.05).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(vocab, HIDDEN))
    for block in range(LAYERS):
        for name, shape in {
            "attn_q": (HIDDEN, HIDDEN),
            "attn_k": (kv, HIDDEN),
            "attn_v": (kv, HIDDEN),
            "attn_output": (HIDDEN, HIDDEN),
            "ffn_gate": (FFN, HIDDEN),
            "ffn_up": (FFN, HIDDEN),
            "ffn_down": (HIDDEN, FFN),
        }.items():
            writer.add_tensor(f"blk.{block}.{name}.weight", weight(*shape))
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{block}.{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def test_a_gguf_is_converted_once_into_the_cache_and_loads_as_a_checkpoint(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "models"
    checkpoint = Path(local_checkpoint(str(tiny_gguf), cache))
    assert checkpoint == cache / gguf_sha256(tiny_gguf)
    written = {file.name: file.stat().st_mtime_ns for file in checkpoint.iterdir()}
    assert "config.json" in written and "source.json" in written
    assert Path(local_checkpoint(str(tiny_gguf), cache)) == checkpoint  # the second time: read, not converted
    assert {file.name: file.stat().st_mtime_ns for file in checkpoint.iterdir()} == written
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.num_key_value_heads) == (
        LAYERS,
        HIDDEN,
        KV_HEADS,
    )
    assert "quantization_config" not in model.config.to_dict()
    tokenizer = load_tokenizer(str(tiny_gguf), cache_dir=str(cache))
    assert eos_ids(model, tokenizer) == {2}  # <|im_end|>, from the tokenizer and the generation config
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text)["input_ids"]
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    assert out.shape[1] == len(ids) + 4 or int(out[0, -1]) == 2
