"""Which device each pool process of a worker uses, and the device errors after which a process must go.

One process per GPU: with ``GENJOB_DEVICE`` ``cuda`` (or ``auto`` on a machine with a GPU) the i-th pool
process of ``genjob worker -c N`` takes ``cuda:i`` (``pool_devices``; its index is billiard's, which a
replacement child inherits from the process it replaces, so a fresh process takes the same GPU), and
``-c N`` above the GPUs this worker sees is refused. An explicit ``cuda:1`` names one GPU: one process.
``cpu`` (or ``auto`` without a GPU) is the same device for every process. The main process never
touches CUDA (``genjob.worker.main``): it learns the device count from the device probe, a process of its
own, and each pool child writes its device into its own copy of the app's settings
(``take_pool_device``), which everything it builds reads (models, caches, measured costs).

A sticky device error (a device-side assert, an illegal memory access: CUDA's context is unusable
until the process ends) fails every later chunk of the process it hit; ``is_sticky_device_error``
tells it from a chunk's other faults, so that the process gives its items back and exits
(``genjob.worker.chunks`` and ``genjob.worker.tasks``), and Celery starts a fresh one.
Must not know: the database, HTTP, the CLI's option parsing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

# What CUDA's sticky errors say (torch raises them as RuntimeError, or torch.AcceleratorError since 2.8);
# out of memory is not one of them (whatever its type): the engine goes on with half the batch.
STICKY_MARKS = (
    "CUDA error",
    "device-side assert",
    "illegal memory access",
    "illegal instruction",
    "unspecified launch failure",
    "CUBLAS_STATUS_EXECUTION_FAILED",
    "CUDNN_STATUS_EXECUTION_FAILED",
)


class TooManyProcesses(ValueError):
    """More pool processes than GPUs: each would not get one of its own."""


def pool_devices(device: str, concurrency: int, cuda_devices: int) -> list[str]:
    """The device of each pool process, by index, for ``GENJOB_DEVICE=device``, ``-c concurrency`` and
    the number of CUDA devices the probe saw; TooManyProcesses (one line) where there are not enough."""
    if device == "auto":
        device = "cuda" if cuda_devices else "cpu"
    if device == "cuda":
        if concurrency > cuda_devices:
            raise TooManyProcesses(
                f"-c {concurrency} asks for one pool process per GPU, and this machine has "
                f"{cuda_devices}: use -c {cuda_devices} or fewer (or one worker per GPU)"
            )
        return [f"cuda:{index}" for index in range(concurrency)]
    if device.startswith("cuda:") and concurrency > 1:
        raise TooManyProcesses(
            f"GENJOB_DEVICE={device} names one GPU: -c {concurrency} would put {concurrency} processes on "
            "it; use -c 1, or GENJOB_DEVICE=cuda to give each pool process a GPU of its own"
        )
    return [device] * concurrency


def pool_index() -> int:
    """This pool process's index (0 … concurrency − 1; 0 outside a prefork pool)."""
    from celery.utils.log import current_process_index

    return current_process_index(base=0) or 0


def take_pool_device(app: Any) -> str | None:
    """In a pool child: its device (``app.genjob_pool_devices``, set before the fork) into its own copy of
    the app's settings; returns it, or None where the worker was started without a plan (as is)."""
    devices: Sequence[str] | None = getattr(app, "genjob_pool_devices", None)
    if not devices:
        return None
    index = pool_index()
    device = devices[index % len(devices)]
    settings = app.genjob_settings
    if settings.device != device:
        app.genjob_settings = settings.model_copy(update={"device": device})
    log.info("pool process %d: device %s", index, device)
    return device


def is_sticky_device_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is an error that leaves the device unusable
    in this process: torch.AcceleratorError, or a RuntimeError carrying one of CUDA's sticky errors."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _sticky(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _sticky(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc):
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return isinstance(exc, RuntimeError) and any(mark in str(exc) for mark in STICKY_MARKS)
