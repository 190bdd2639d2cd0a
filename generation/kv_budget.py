"""The K/V budget: how much memory a device can still give the K/V caches (``device_room``), how many
waiting rows a batch can take within it (``plan_admission``), and the batch's row limit after an
out-of-memory error (``BatchRoom``: halved, then a row more for each row that leaves).

The caches (``SlotCache``, the target's and a draft model's) hold slots × capacity tokens, at
``bytes_per_token`` each (both caches together); capacity is the longest row's prompt, new tokens and
drafts. They grow one layer at a time (``SlotCache.reserve``): a growth with rows to keep holds one
layer's old buffers beside the new ones at its peak, within the device's margin.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial

import torch

# What a CUDA device keeps back from the K/V caches: the forwards' activations (a prefill of the whole
# batch the largest), the logits, a layer's old caches while they grow, the allocator's fragments.
MARGIN_FRACTION = 0.1
MIN_MARGIN_BYTES = 1 << 30


def device_room(device: torch.device) -> int | None:
    """Bytes a CUDA device can still give K/V caches: its free memory and what torch's allocator holds
    unused, less the margin. None off CUDA: no device bound (only GENJOB_KV_CACHE_BYTES). Read while
    the caller's own caches are released, after its weights load."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    margin = max(MIN_MARGIN_BYTES, int(MARGIN_FRACTION * total))
    return max(0, free + unused - margin)


def give_back(device: torch.device) -> None:
    """After caches were freed: hand the memory back to the device (torch's CUDA allocator keeps it
    otherwise), or on a CPU to the system (glibc keeps freed blocks in its heap: without a trim a
    worker's RSS grew by a job's caches after each job although they were freed)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif (trim := _malloc_trim()) is not None:
        trim(0)


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, if this process has it (not on macOS, musl or Windows)."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        return trim
    except (OSError, AttributeError):
        return None


@dataclass(frozen=True)
class Held:
    """What the caches hold now: ``slots`` × ``capacity`` tokens, ``rows`` of them in use."""

    slots: int
    capacity: int
    rows: int

    def bytes_for(self, slots: int, capacity: int, per_token: int) -> int:
        """Bytes held once there is room for ``slots`` × ``capacity`` (buffers never shrink)."""
        return max(slots, self.slots) * max(capacity, self.capacity) * per_token


@dataclass(frozen=True)
class Admission:
    rows: int  # waiting rows to admit now (the first ones)
    slots: int  # slots to reserve
    capacity: int  # tokens per slot to reserve
    fresh: bool = False  # the caches must grow and hold no row: drop them first (nothing to copy)


def plan_admission(
    held: Held,
    row_capacities: Sequence[int],
    waiting_capacities: Sequence[int],
    *,
    limit: int,
    budget: int | None,
    per_token: int,
) -> Admission:
    """The waiting rows (in order) to admit: up to ``limit`` rows in all, while the caches stay within
    ``budget`` bytes (one row at least into an empty batch); the slots grow by doubling, within both.
    Into an empty batch, the buffers held serve if large enough, else fresh ones replace them."""
    within = partial(_plan, limit=limit, budget=budget, per_token=per_token)
    if held.rows:
        return within(held, row_capacities, waiting_capacities)
    plan = within(Held(0, 0, 0), [], waiting_capacities)
    if plan.slots <= held.slots and plan.capacity <= held.capacity:  # the buffers held serve
        return Admission(plan.rows, held.slots, held.capacity)
    return Admission(plan.rows, plan.slots, plan.capacity, fresh=bool(held.slots))


def _plan(
    held: Held,
    row_capacities: Sequence[int],
    waiting_capacities: Sequence[int],
    *,
    limit: int,
    budget: int | None,
    per_token: int,
) -> Admission:
    start = held.rows
    capacity = max(row_capacities, default=0)
    count = 0
    for wanted in waiting_capacities[: max(0, limit - start)]:
        wider = max(capacity, wanted)
        if (
            budget is not None
            and start + count
            and held.bytes_for(start + count + 1, wider, per_token) > budget
        ):
            break
        capacity, count = wider, count + 1
    slots = min(limit, max(start + count, 2 * held.slots))
    while (
        budget is not None and slots > start + count and held.bytes_for(slots, capacity, per_token) > budget
    ):
        slots -= 1
    return Admission(count, max(slots, start + count), capacity)


class BatchRoom:
    """How many rows a batch may hold: its size (``max_rows``, the caller's), halved after an
    out-of-memory error and growing back by a row for each row that leaves; and how many bytes its K/V
    caches may hold (``budget``)."""

    def __init__(self, kv_budget_bytes: int | None = None) -> None:
        self.kv_budget_bytes = kv_budget_bytes  # GENJOB_KV_CACHE_BYTES (None: no bound of its own)
        self.device_room: int | None = None  # on CUDA: ``device_room``, read whenever the caches are empty
        self.oom_cap: int | None = None  # rows allowed since an out-of-memory error (None: max_rows)

    @property
    def budget(self) -> int | None:
        """Bytes the K/V caches may hold: the setting's and the device's bounds (None: unbounded)."""
        bounds = [b for b in (self.kv_budget_bytes, self.device_room) if b is not None]
        return min(bounds) if bounds else None

    def limit(self, max_rows: int) -> int:
        return max_rows if self.oom_cap is None else max(1, min(max_rows, self.oom_cap))

    def halve(self, rows: int, max_rows: int) -> int:
        """Out of memory in a forward of ``rows`` rows: half as many from now on (a single row: the
        model does not fit, raised again)."""
        rows = min(self.limit(max_rows), max(1, rows))
        if rows == 1:
            raise torch.OutOfMemoryError("out of memory with a single row: the model does not fit")
        self.oom_cap = rows // 2
        return self.oom_cap

    def row_left(self, max_rows: int) -> None:
        if self.oom_cap is not None:
            self.oom_cap = self.oom_cap + 1 if self.oom_cap + 1 < max_rows else None
