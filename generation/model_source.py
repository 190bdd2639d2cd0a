"""Turn a model location into a local checkpoint transformers loads as it is, converting a GGUF file once.

A location is a hub id or a local directory, given back unchanged, or a ``.gguf`` file (llama.cpp's
format, usually quantized). transformers can read a GGUF only by dequantizing it on every load (and
refuses to save the result), so ``local_checkpoint`` converts it once into the model cache: the
directory ``<cache_dir>/<sha256 of the file>/`` holding a plain checkpoint (its config without
``quantization_config``, float32 safetensors, the tokenizer with its chat template, the generation
config) and ``source.json`` (the GGUF's path, size and sha256, the transformers version). It is
written into a temporary sibling and renamed into place, so a crash leaves no half checkpoint, under
``fcntl.flock`` on ``<cache_dir>/<sha256>.lock``, so processes converting at once convert once.

``local_tokenizer`` is what submit needs (a chat template, a token count, the context length): for a
GGUF, ``<cache_dir>/<sha256>.tokenizer/`` with only the tokenizer files and ``config.json``, read
from the file's metadata with the ``gguf`` package and transformers' own GGUF tokenizer builders,
without torch (the API process may have none; transformers' GGUF reader imports it), or the full
checkpoint if it is already there. The tokenizer files are the same either way.
Must not know: the database, Celery, HTTP, the core's settings.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = "~/.cache/genjob/models"
SOURCE_FILE = "source.json"
GGUF_MAGIC = b"GGUF"
TOKENIZER_SUFFIX = ".tokenizer"
# The ids a GGUF names its special tokens by, under ``tokenizer.ggml.``, as the tokenizer's arguments.
SPECIAL_TOKENS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded, or a draft does not fit its target."""


def cache_root(cache_dir: str | Path | None) -> Path:
    """The model cache: ``cache_dir``, or ``~/.cache/genjob/models`` when None or empty."""
    return Path(cache_dir or DEFAULT_CACHE_DIR).expanduser()


def is_gguf_location(location: str) -> bool:
    return location.lower().endswith(".gguf")


def gguf_file(location: str) -> Path | None:
    """The GGUF file ``location`` names (absolute), None if it names no ``.gguf``; ModelLoadError if it
    names one that is missing or is not GGUF."""
    if not is_gguf_location(location):
        return None
    path = Path(location).expanduser().absolute()
    try:
        with path.open("rb") as stream:
            magic = stream.read(len(GGUF_MAGIC))
    except FileNotFoundError:
        raise ModelLoadError(f"no such GGUF file: {path}") from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF file: {path} (it does not start with the GGUF magic bytes)")
    return path


@lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def gguf_sha256(path: str | Path) -> str:
    """The hex sha256 of the file: computed once per process per (path, size, mtime)."""
    resolved = Path(path).expanduser().resolve()
    stat = resolved.stat()
    return _file_sha256(str(resolved), stat.st_size, stat.st_mtime_ns)


def local_checkpoint(location: str, cache_dir: str | Path | None) -> str:
    """``location`` unchanged, unless it is a ``.gguf`` file: then its plain checkpoint in the model
    cache, converted now if no process did before (this needs torch, ``gguf`` and ``accelerate``)."""
    path = gguf_file(location)
    if path is None:
        return location
    sha = gguf_sha256(path)
    target = cache_root(cache_dir) / sha
    return str(_converted(path, sha, target, _write_checkpoint, what="checkpoint"))


def local_tokenizer(location: str, cache_dir: str | Path | None) -> str:
    """``location`` unchanged, unless it is a ``.gguf`` file: then a directory with its tokenizer and
    ``config.json`` (the full checkpoint if there is one), converted without torch if need be."""
    path = gguf_file(location)
    if path is None:
        return location
    sha = gguf_sha256(path)
    root = cache_root(cache_dir)
    full = root / sha
    if (full / SOURCE_FILE).is_file():
        return str(full)
    target = root / f"{sha}{TOKENIZER_SUFFIX}"
    return str(_converted(path, sha, target, _write_tokenizer, what="tokenizer", instead=full))


def _converted(
    path: Path,
    sha: str,
    target: Path,
    write: Callable[[Path, Path], None],
    *,
    what: str,
    instead: Path | None = None,
) -> Path:
    """``target``, written by ``write(path, temporary)`` unless a process did before (or ``instead``,
    a directory as good, is there): once, under the file lock, renamed into place when complete."""
    if (target / SOURCE_FILE).is_file():
        return target
    root = target.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root / f"{sha}.lock"):
            for ready in (target, instead):
                if ready is not None and (ready / SOURCE_FILE).is_file():
                    return ready  # another process converted it while this one waited
            for stale in root.glob(f".{target.name}-*"):  # a crashed conversion's (the lock is ours)
                shutil.rmtree(stale, ignore_errors=True)
            started = time.perf_counter()
            log.info("converting GGUF %s (%s) once into %s", path, what, target)
            temporary = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
            try:
                write(path, temporary)
                _write_source(path, sha, temporary, what=what)
                temporary.chmod(0o755)  # as mkdir leaves a directory (mkdtemp's is private)
                if target.exists():  # a directory left without source.json: not ours to keep
                    shutil.rmtree(target)
                temporary.rename(target)
            except BaseException:
                shutil.rmtree(temporary, ignore_errors=True)
                raise
            log.info("converted GGUF %s (%s) in %.1f s", path.name, what, time.perf_counter() - started)
    except OSError as exc:
        raise ModelLoadError(f"cannot convert GGUF {path} into {root}: {_first_line(exc)}") from exc
    return target


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_source(path: Path, sha: str, directory: Path, *, what: str) -> None:
    from transformers import __version__ as transformers_version

    source = {
        "gguf": str(path),
        "size": path.stat().st_size,
        "sha256": sha,
        "contents": what,
        "transformers": transformers_version,
    }
    (directory / SOURCE_FILE).write_text(json.dumps(source, indent=1) + "\n", encoding="utf-8")


def _require(modules: tuple[str, ...], *, doing: str, extra: str) -> None:
    """ModelLoadError naming the packages to install, unless every one of ``modules`` imports."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        names = " ".join(missing)
        raise ModelLoadError(f"{doing} needs {', '.join(missing)}: pip install {names} (or genjob[{extra}])")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _write_checkpoint(path: Path, out: Path) -> None:
    """The GGUF dequantized by transformers, saved as a plain float32 checkpoint with its tokenizer."""
    _require(("torch", "transformers", "gguf", "accelerate"), doing="loading a GGUF model", extra="worker")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    auto: Any = AutoModelForCausalLM  # transformers' from_config is untyped
    try:
        model: Any = auto.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, trust_remote_code=False
        )
        settings = model.config.to_dict()
        settings.pop("quantization_config", None)  # what makes save_pretrained refuse
        model_type = settings.pop("model_type")
        config = AutoConfig.for_model(model_type, **settings)
        plain: Any = auto.from_config(config, dtype=torch.float32)
        plain.load_state_dict(model.state_dict())
        plain.generation_config = model.generation_config
        del model
        plain.save_pretrained(str(out))
        gguf_tokenizer(path).save_pretrained(str(out))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot convert GGUF {path}: {_first_line(exc)}") from exc


def _write_tokenizer(path: Path, out: Path) -> None:
    """The tokenizer files and a ``config.json`` (the context length), without torch."""
    try:
        metadata = gguf_metadata(path)
        gguf_tokenizer(path, metadata).save_pretrained(str(out))
        config = gguf_config(metadata)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot read the tokenizer of GGUF {path}: {_first_line(exc)}") from exc
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The file's metadata, ``{key: value}`` (arrays as lists), read with the ``gguf`` package (numpy)."""
    _require(("transformers", "gguf"), doing="reading a GGUF tokenizer", extra="api")
    import gguf

    reader = gguf.GGUFReader(str(path))
    return {key: field.contents() for key, field in reader.fields.items()}


def gguf_tokenizer(path: Path, metadata: dict[str, Any] | None = None) -> Any:
    """The file's tokenizer, built as ``AutoTokenizer.from_pretrained(folder, gguf_file=name)`` does
    (transformers' builders from the file's vocabulary, merges, special tokens and chat template)."""
    metadata = gguf_metadata(path) if metadata is None else metadata
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    architecture = metadata["general.architecture"]
    grouped = {
        group: {
            name: metadata[f"tokenizer.{key}"]
            for key, name in renames.items()
            if f"tokenizer.{key}" in metadata
        }
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    described, arguments = grouped["tokenizer"], grouped["tokenizer_config"]
    if described.get("tokenizer_type") == "llama":  # as transformers: old sentencepiece files add BOS
        arguments.setdefault("add_bos_token", True)
    elif described.get("tokenizer_type") == "gemma4":  # as transformers: its template writes BOS itself
        arguments["add_bos_token"] = False
    for name, key in SPECIAL_TOKENS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        arguments[name] = described["tokens"][token_id] if token_id is not None else None
    backend, extra = convert_gguf_tokenizer(architecture, described)
    build: Any = PreTrainedTokenizerFast  # untyped in transformers
    return build(tokenizer_object=backend, **arguments, **extra)


def gguf_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """The config values the metadata states (as transformers names them: ``max_position_embeddings``
    …, the special token ids), with the architecture as ``model_type``."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    mapping: dict[str, dict[str, str | None]] = GGUF_CONFIG_MAPPING  # type: ignore[assignment]
    architecture = metadata["general.architecture"]
    config: dict[str, Any] = {"model_type": architecture}
    for prefix in (architecture, "tokenizer"):
        for key, name in mapping.get(prefix, {}).items():
            value = metadata.get(f"{prefix}.{key}")
            if name and value is not None:
                config[name] = value
    return config
