"""What a job ran with: its models' revisions and the worker's library versions, noted once per job.

A model's revision is its hub commit when it comes from the hub cache (``…/snapshots/<commit>``, or
looked up there for a hub id), ``sha256:`` of the file for a GGUF file (the key of its converted
checkpoint in the model cache), else ``sha256:`` of its weight files (``*.safetensors``, else
``*.bin``); a weight file over ``FULL_HASH_BYTES`` is fingerprinted by its size and its first and last
``SAMPLE_BYTES`` (``sampled-sha256:``), so a big model costs a second, not a minute. Each is
computed once per process. Must not know: HTTP, the CLI.
"""

from __future__ import annotations

import hashlib
import platform
import re
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from genjob.generation.model_source import gguf_sha256, is_gguf_location
from genjob.options import JobSpec
from genjob.store.activity import record_provenance

COMMIT = re.compile(r"^[0-9a-f]{40}$")
FULL_HASH_BYTES = 1 << 30
SAMPLE_BYTES = 16 << 20
LIBRARIES = ("genjob", "torch", "transformers", "safetensors", "tokenizers", "celery")


def _weights_hash(directory: Path) -> str | None:
    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))
    if not files:
        return None
    digest = hashlib.sha256()
    sampled = False
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}:".encode())
        with path.open("rb") as stream:
            if size <= FULL_HASH_BYTES:
                while block := stream.read(1 << 20):
                    digest.update(block)
                continue
            sampled = True
            digest.update(stream.read(SAMPLE_BYTES))
            stream.seek(size - SAMPLE_BYTES)
            digest.update(stream.read(SAMPLE_BYTES))
    return ("sampled-sha256:" if sampled else "sha256:") + digest.hexdigest()


@lru_cache(maxsize=32)
def model_revision(location: str) -> str | None:
    """The hub commit or weights hash of the model at ``location`` (path, GGUF file or hub id); None if
    unknown."""
    path = Path(location)
    try:
        if is_gguf_location(location) and path.is_file():
            return "sha256:" + gguf_sha256(path)
        if path.is_dir():
            resolved = path.resolve()
            if resolved.parent.name == "snapshots" and COMMIT.match(resolved.name):
                return resolved.name
            return _weights_hash(resolved)
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(location, "config.json")
        if isinstance(cached, str) and COMMIT.match(Path(cached).parent.name):
            return Path(cached).parent.name
    except (OSError, ValueError, ImportError):
        return None
    return None


@lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        import torch

        if torch.version.cuda:
            versions["cuda"] = str(torch.version.cuda)
    except ImportError:
        pass
    return versions


def note_provenance(session: Session, *, job_id: str, spec: JobSpec) -> bool:
    """Record the job's model revisions and this worker's versions, unless a worker already did."""
    return record_provenance(
        session,
        job_id=job_id,
        model_revision=model_revision(spec.model),
        assistant_revision=model_revision(spec.assistant) if spec.assistant else None,
        versions=library_versions(),
    )


_NOTED: OrderedDict[str, None] = OrderedDict()  # jobs this process has noted (the last few hundred)


def note_once(tx: Callable[..., Any], *, job_id: str, spec: JobSpec) -> None:
    """``note_provenance`` in a transaction ``tx``, the first time this process runs a chunk of the job."""
    if job_id in _NOTED:
        return
    tx(note_provenance, job_id=job_id, spec=spec)
    _NOTED[job_id] = None
    while len(_NOTED) > 512:
        _NOTED.popitem(last=False)
