"""The worker's device check before it consumes anything.

A worker whose device cannot start (``GENJOB_DEVICE=cuda`` on a machine without one, a driver that
fails) or cannot run a warm-up computation must not take chunks it can only fail: ``probe_device``
runs ``check_device`` before the Celery worker starts, in a short-lived process of its own (spawned,
never forked: the worker's main process runs no torch op and never touches CUDA before its pool
forks, ``genjob.worker.main``), and ``genjob worker`` exits non-zero with one line saying why.
Must not know: the database, HTTP, the CLI.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import NamedTuple

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 300.0  # a device that has not run a 64×64 matmul by then is taken as unusable


class DeviceUnusable(RuntimeError):
    """The worker's device cannot start or run a warm-up computation."""


class Probed(NamedTuple):
    device: str  # the device's name, as the probe resolved it (cuda:0, cpu)
    pid: int  # the process it ran in
    cuda_devices: int  # the CUDA devices that process saw (0 where the device is not CUDA)


def check_device(device: str) -> str:
    """Start ``device`` and run a small computation on it; returns its name, or raises DeviceUnusable."""
    import torch

    from genjob.generation.loading import resolve_device

    try:
        resolved = resolve_device(device)
        if resolved.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available on this machine (no GPU, or no driver)")
        probe = torch.ones((64, 64), device=resolved)
        float((probe @ probe).sum().item())
    except Exception as exc:
        raise DeviceUnusable(f"device {device!r} cannot start: {type(exc).__name__}: {exc}") from exc
    return str(resolved)


def probe_device(device: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> Probed:
    """``check_device`` in a new Python process (not a fork of this one), so that this process runs no
    torch op and creates no CUDA context: the device's name, the pid it ran in and the CUDA devices it
    saw (``genjob.worker.devices`` gives each pool process one), or DeviceUnusable."""
    code = "import sys; from genjob.worker.device_probe import _probe_main; _probe_main(sys.argv[1])"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, device], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        raise DeviceUnusable(
            f"device {device!r} ran no warm-up computation within {timeout_s:.0f} s"
        ) from exc
    lines = done.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    if done.returncode == 0 and "device" in answer:
        return Probed(str(answer["device"]), int(answer["pid"]), int(answer.get("cuda_devices", 0)))
    errors = done.stderr.strip().splitlines()
    reason = answer.get("error") or (errors[-1] if errors else f"the probe exited {done.returncode}")
    raise DeviceUnusable(str(reason))


def _probe_main(device: str) -> None:
    """The probe process's body: one JSON line on stdout (``device`` and ``pid``, or ``error``)."""
    try:
        name = check_device(device)
        import torch

        cuda = torch.cuda.device_count() if name.startswith("cuda") else 0
        print(json.dumps({"device": name, "pid": os.getpid(), "cuda_devices": cuda}))
    except DeviceUnusable as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(1)
