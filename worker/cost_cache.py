"""The forward costs a worker measured, kept on disk so that a new process need not measure them again.

Measuring the cost grid (``CostModel.measure``) takes seconds to minutes on a CPU, and a job pays it as
decoding time (its measured speedup stays honest); a worker that restarts, or an embedded ``genjob
submit`` run after another, would pay it every time. Each measurement is stored as JSON under
``GENJOB_COST_CACHE_DIR``, named by a hash of everything it depends on (each model's name, config and
weight files (their sizes and times), the device's name, the dtype, torch's version and its thread
count) and by the largest batch size and query length it covers, so one grid serves every job within
it. Only a steady measurement is kept (its passes agreed: one taken while other work kept the machine
busy would mislead later processes). A stored measurement older than ``MAX_AGE_S`` is measured again;
live rounds correct what drifts between (the live scale in ``CostModel``). An unreadable file is
measured again and replaced; writes are atomic.
Must not know: Celery, the database, the core's store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
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
    """A stored measurement of this pair on this device covering ``max_batch`` and ``max_query`` (the
    smallest such grid: one measured for B ≤ 64 and q ≤ 9 serves every job within them), else a new
    one, stored. ``directory`` empty or None: always measure."""
    if not directory:
        return CostModel.measure(target, draft, max_batch=max_batch, max_query=max_query)
    folder, stem = Path(directory).expanduser(), _identity(target, draft)
    for path in _covering(folder, stem, max_batch=max_batch, max_query=max_query):
        costs = _read(path)
        if costs is not None:
            log.info("cost model: reusing %s (measured %s ago)", path, _age(path))
            return costs
    costs = CostModel.measure(target, draft, max_batch=max_batch, max_query=max_query)
    if costs.steady:
        _write(folder / f"{stem}-b{max_batch}-q{max_query}.json", costs)
    else:
        log.warning("cost model: the machine was busy while measuring (passes disagree); not kept")
    return costs


def _covering(folder: Path, stem: str, *, max_batch: int, max_query: int) -> list[Path]:
    """Stored grids of this identity whose batch sizes and query lengths reach the ones asked for,
    smallest first."""
    found = []
    for path in folder.glob(f"{stem}-b*-q*.json"):
        match = re.fullmatch(rf"{stem}-b(\d+)-q(\d+)\.json", path.name)
        if match and int(match[1]) >= max_batch and int(match[2]) >= max_query:
            found.append((int(match[1]) * int(match[2]), path))
    return [path for _, path in sorted(found)]


def _identity(target: PreTrainedModel, draft: PreTrainedModel | None) -> str:
    """A hash of what the costs depend on besides the grid's extent."""
    key = {
        "format": FORMAT,
        "target": _model_identity(target),
        "draft": _model_identity(draft) if draft is not None else None,
        "device": _device_identity(target.device),
        "dtype": str(target.dtype),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


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
