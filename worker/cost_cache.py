"""The forward costs a worker measured, kept on disk so that a new process need not measure them again.

Measuring the cost grid (``CostModel.measure``) takes seconds to minutes on a CPU, and a job pays it as
decoding time (its measured speedup stays honest); a worker that restarts, or an embedded ``genjob
submit`` run after another, would pay it every time. Each measurement is stored as JSON under
``GENJOB_COST_CACHE_DIR``, named by a hash of everything it depends on: each model's name, config and
weight files (their sizes and times), the batch size and draft length it covers, the device's name, the
dtype, torch's version and its thread count; only a steady measurement is kept (its passes agreed: one
taken while other work kept the machine busy would mislead later processes). A stored measurement
older than ``MAX_AGE_S`` is measured again; live rounds correct what drifts between (the residual in
``CostModel``). An unreadable file is measured again and replaced; writes are atomic.
Must not know: Celery, the database, the core's store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from genjob.generation.costs import CostModel

log = logging.getLogger(__name__)

MAX_AGE_S = 7 * 24 * 3600
FORMAT = 1  # bump when the grid CostModel.measure times changes meaning


def load_or_measure(
    directory: str | None,
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    *,
    max_batch: int,
    max_query: int,
) -> CostModel:
    """The stored measurement for this pair, batch and draft length on this device, else a new one
    (stored). ``directory`` empty or None: always measure."""
    path = _path(directory, target, draft, max_batch=max_batch, max_query=max_query)
    if path is not None:
        costs = _read(path)
        if costs is not None:
            log.info("cost model: reusing %s (measured %s ago)", path, _age(path))
            return costs
    costs = CostModel.measure(target, draft, max_batch=max_batch, max_query=max_query)
    if path is not None and costs.steady:
        _write(path, costs)
    elif path is not None:
        log.warning("cost model: the machine was busy while measuring (passes disagree); not kept")
    return costs


def _path(
    directory: str | None,
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    *,
    max_batch: int,
    max_query: int,
) -> Path | None:
    if not directory:
        return None
    key = {
        "format": FORMAT,
        "target": _model_identity(target),
        "draft": _model_identity(draft) if draft is not None else None,
        "max_batch": max_batch,
        "max_query": max_query,
        "device": _device_identity(target.device),
        "dtype": str(target.dtype),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return Path(directory).expanduser() / f"{digest}.json"


def _model_identity(model: PreTrainedModel) -> dict[str, Any]:
    """The model's name, its config, and for a local directory each file's size and modification time
    (retrained weights in the same place are a different model)."""
    name = str(getattr(model, "name_or_path", "") or "")
    files: dict[str, list[int]] = {}
    folder = Path(name)
    if name and folder.is_dir():
        for file in sorted(folder.iterdir()):
            if file.is_file():
                stat = file.stat()
                files[file.name] = [stat.st_size, stat.st_mtime_ns]
        name = str(folder.resolve())
    return {"name": name, "config": model.config.to_json_string(use_diff=False), "files": files}


def _device_identity(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}:{torch.version.cuda}"
    return f"{device.type}:{_cpu_name()}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read(path: Path) -> CostModel | None:
    try:
        if time.time() - path.stat().st_mtime > MAX_AGE_S:
            return None
        return CostModel.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("cost model: ignoring unreadable %s (%s); measuring again", path, exc)
        return None


def _write(path: Path, costs: CostModel) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as out:
            json.dump(costs.to_json(), out)
        os.replace(out.name, path)
    except OSError as exc:  # a read-only home, a full disk: the measurement still serves this process
        log.warning("cost model: cannot store %s (%s)", path, exc)


def _age(path: Path) -> str:
    seconds = max(0, int(time.time() - path.stat().st_mtime))
    return f"{seconds // 3600} h {seconds % 3600 // 60} min" if seconds >= 3600 else f"{seconds} s"
