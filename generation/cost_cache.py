"""The forward costs a worker measured and learnt, kept on disk for the processes that follow.

A job never waits for a full measurement: ``costs_for`` reads what earlier processes kept for this pair
on this device and measures only the batch rows it lacks, as a cheap prior (``quick_prior``: a few
forwards at the batch size in use and at B = 1, a fraction of a second for a small model on a CPU),
merged into the kept grid and stored at once. The job's live rounds then learn what the dummy forwards
miss (the live scale per draft length), and ``remember`` merges that into the file after each chunk,
weighted by its rounds. ``calibrate`` (``genjob calibrate``) measures the thorough grid ahead of the
jobs; it counts more (``CALIBRATED_WEIGHT``), and a grid measured while the machine was busy counts
less, but nothing measured is thrown away (``CostModel.merged``: a weighted mean per batch row).

One JSON file per identity under ``GENJOB_COST_CACHE_DIR``: a hash of everything the costs depend on
(each model's name, config and weight files (their sizes and times), the device's name, the dtype,
torch's version and its thread count). A file older than ``MAX_AGE_S`` is measured again; one that
cannot be read is measured again and replaced; writes are atomic, and a lock file keeps two processes
of one machine from losing each other's merge. A directory that cannot be written only costs the next
process the prior again. ``measured_costs``: a pair's costs once per process (its models loaded by
name). Takes a directory, never the worker's settings. Must not know: Celery, the database, the core.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from genjob.generation.cost_timing import grid_batches, measure_grid, quick_prior
from genjob.generation.costs import CostModel
from genjob.generation.loading import load_model

log = logging.getLogger(__name__)

MAX_AGE_S = 7 * 24 * 3600
# Bump when what the file holds changes meaning (3: CPU weights laid out by lay_out_for_cpu; 4: long grid).
FORMAT = 4
PRIOR_WEIGHT = 1.0  # a quick prior's rows
CALIBRATED_WEIGHT = 3.0  # a steady thorough grid's rows (``genjob calibrate``); a busy one counts 1


def cost_file(directory: str | None, target: PreTrainedModel, draft: PreTrainedModel | None) -> Path | None:
    """Where this pair's costs on this device are kept (None: GENJOB_COST_CACHE_DIR is empty)."""
    if not directory:
        return None
    return Path(directory).expanduser() / f"{_identity(target, draft)}.json"


def costs_for(
    path: Path | None,
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    *,
    batches: Sequence[int],
    max_query: int,
) -> CostModel:
    """Costs serving ``batches`` up to ``max_query`` tokens per row: the kept ones where they cover
    them (``measure_seconds`` 0), else with the rows they lack measured now (a quick prior) and kept."""
    with _locked(path):
        kept = _read(path) if path is not None else None
        missing = [b for b in sorted(set(batches)) if kept is None or not kept.covers(b, max_query)]
        if kept is not None and not missing:
            log.info("cost model: reusing %s (kept %s ago)", path, _age(path))
            return kept
        prior = quick_prior(target, draft, batches=missing, max_query=max_query)
        model = kept.merged(prior, weight=PRIOR_WEIGHT) if kept is not None else prior
        log.info(
            "cost model: a prior for B %s, q <= %d measured in %.2f s (live rounds learn the rest)%s",
            missing,
            max_query,
            prior.measure_seconds,
            f"; kept in {path}" if path else "",
        )
        if path is not None:
            _write(path, model)
        return model


def calibrate(
    path: Path | None,
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    *,
    max_batch: int,
    max_query: int,
) -> CostModel:
    """The thorough grid up to ``max_batch`` and ``max_query``, kept with ``CALIBRATED_WEIGHT`` (1 when
    the machine was busy); read instead where a steady calibration already covers it."""
    with _locked(path):
        kept = _read(path) if path is not None else None
        wanted = grid_batches(max_batch)
        if kept is not None and all(
            kept.covers(b, max_query) and kept.row_weight.get(b, 0.0) >= CALIBRATED_WEIGHT for b in wanted
        ):
            return kept
        grid = measure_grid(target, draft, max_batch=max_batch, max_query=max_query)
        weight = CALIBRATED_WEIGHT if grid.steady else PRIOR_WEIGHT
        if kept is None:
            grid.row_weight = {b: weight for b in grid.batch_sizes}
        model = kept.merged(grid, weight=weight) if kept is not None else grid
        if path is not None:
            _write(path, model)
        return model


def remember(path: Path | None, live: CostModel) -> None:
    """Merge what ``live`` learnt since it was last kept (its live scale, weighted by the rounds behind
    it) into the kept file; the rounds then count as kept."""
    if path is None or not any(live.scale_rounds.values()):
        return
    with _locked(path):
        kept = _read(path) or CostModel.from_json(live.to_json())
        _write(path, kept.with_scale_of(live))
    for k, rounds in live.scale_rounds.items():
        live.scale_weight[k] = live.scale_weight.get(k, 0.0) + rounds
    live.scale_rounds.clear()


@contextmanager
def _locked(path: Path | None) -> Iterator[None]:
    """An exclusive lock on ``path``'s lock file for the block (no lock where none can be taken)."""
    if path is None:
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 (held for the block)
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


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


def _read(path: Path | None) -> CostModel | None:
    if path is None:
        return None
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


def _age(path: Path | None) -> str:
    if path is None:
        return "-"
    seconds = max(0, int(time.time() - path.stat().st_mtime))
    return f"{seconds // 3600} h {seconds % 3600 // 60} min" if seconds >= 3600 else f"{seconds} s"


@lru_cache(maxsize=8)
def measured_costs(
    target: str,
    draft: str | None,
    device: str,
    dtype: str,
    batches: tuple[int, ...],
    max_query: int,
    cache_dir: str | None,
    model_cache_dir: str | None,
) -> tuple[CostModel, Path | None]:
    """The device's costs for this pair at ``batches`` (and the file they are kept in): once per
    process, and on disk in ``cache_dir`` across processes (``costs_for``); the models are
    loaded as ``load_model`` does, GGUF checkpoints from ``model_cache_dir``."""
    target_model = load_model(target, device, dtype, cache_dir=model_cache_dir)
    draft_model = load_model(draft, device, dtype, cache_dir=model_cache_dir) if draft is not None else None
    path = cost_file(cache_dir, target_model, draft_model)
    return costs_for(path, target_model, draft_model, batches=batches, max_query=max_query), path
