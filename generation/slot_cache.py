"""The KV cache of a batch: preallocated slots, each row at its own length, dense from slot 0.

Per layer, K and V live in buffers (slots, heads, capacity, head_dim). Row r holds the K/V of all
its tokens but the last in columns 0..lengths_r-1; a forward of q new tokens writes row r's K/V at
columns lengths_r..lengths_r+q-1 (one indexed write per layer, no concatenation) and reads columns
0..width-1 of the rows in the forward (a view, no copy). Columns past a row's length are stale and
masked. Rows are dense: a forward over rows [start, stop) slices the buffers, and a finished row's
slot is filled by moving the last row into it (one slot copied, never the whole cache). Buffers grow
(copied once) when more rows or columns are needed; ``release`` gives them back (a chunk ended, the
device ran out of memory). How large they may grow: ``genjob.generation.kv_budget``.

We chose this over the two layouts that keep one common length (left padding re-aligned by
shifting rows every round, or masked holes that pile up mid-sequence): nothing is copied per round,
attention reads only up to the longest row, and rows join and leave at any round.
Must not know: the database, Celery, HTTP, the core.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer


class Cursor:
    """Where the current forward writes and reads: rows [start, stop), (rows, q) column indices, and
    the number of columns attention reads."""

    def __init__(self) -> None:
        self.start = 0
        self.stop = 0
        self.columns = torch.zeros(0, 0, dtype=torch.long)
        self.first: int | None = None  # the first column, when every row writes from the same one
        self.width = 0


class SlotLayer(DynamicLayer):
    """One layer's K/V for every slot; ``update`` writes at the cursor and returns the rows' views."""

    def __init__(self, cursor: Cursor, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.cursor = cursor
        self.keys: torch.Tensor = keys
        self.values: torch.Tensor = values
        self.device, self.is_initialized = keys.device, True

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys, self.values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cursor  # key_states (rows, heads, q, head_dim)
        keys, values = self.buffers()
        if c.first is not None:  # every row writes the same columns: a slice, no index
            q = key_states.shape[2]
            keys[c.start : c.stop, :, c.first : c.first + q] = key_states
            values[c.start : c.stop, :, c.first : c.first + q] = value_states
        else:
            rows = torch.arange(c.start, c.stop, device=key_states.device)[:, None].expand_as(c.columns)
            keys.transpose(1, 2)[rows, c.columns] = key_states.transpose(1, 2)
            values.transpose(1, 2)[rows, c.columns] = value_states.transpose(1, 2)
        return keys[c.start : c.stop, :, : c.width], values[c.start : c.stop, :, : c.width]

    def get_seq_length(self, *args: Any, **kwargs: Any) -> int:
        return self.cursor.width


class SlotCache(Cache):
    """A transformers ``Cache`` over slots; shapes come from a model's one-token probe forward."""

    def __init__(self, shapes: list[tuple[int, int]], *, dtype: torch.dtype, device: torch.device) -> None:
        """``shapes``: (heads, head_dim) of each layer's keys (values have the same)."""
        self.cursor = Cursor()
        self.slot_layers = [
            SlotLayer(
                self.cursor,
                torch.zeros(0, heads, 0, head_dim, dtype=dtype, device=device),
                torch.zeros(0, heads, 0, head_dim, dtype=dtype, device=device),
            )
            for heads, head_dim in shapes
        ]
        super().__init__(layers=list(self.slot_layers))

    @property
    def slots(self) -> int:
        return int(self.slot_layers[0].buffers()[0].shape[0])

    @property
    def capacity(self) -> int:
        return int(self.slot_layers[0].buffers()[0].shape[2])

    def held_bytes(self) -> int:
        """Bytes the buffers hold now (every slot's every column, K and V of every layer)."""
        return sum(buffer.nbytes for layer in self.slot_layers for buffer in layer.buffers())

    def bytes_per_token(self) -> int:
        """K and V of one token in every layer."""
        total = 0
        for layer in self.slot_layers:
            keys = layer.buffers()[0]
            total += 2 * keys.shape[1] * keys.shape[3] * keys.element_size()
        return int(total)

    def reserve(self, slots: int, capacity: int) -> None:
        """At least ``slots`` rows of ``capacity`` columns (existing rows copied over once)."""
        if slots <= self.slots and capacity <= self.capacity:
            return
        slots, capacity = max(slots, self.slots), max(capacity, self.capacity)
        for layer in self.slot_layers:
            grown = []
            for old in layer.buffers():
                new = old.new_zeros(slots, old.shape[1], capacity, old.shape[3])  # zeros: finite
                new[: old.shape[0], :, : old.shape[2]] = old
                grown.append(new)
            layer.keys, layer.values = grown

    def move(self, source: int, target: int, columns: int) -> None:
        """Copy the first ``columns`` columns of slot ``source`` into slot ``target``."""
        for layer in self.slot_layers:
            for buffer in layer.buffers():
                buffer[target, :, :columns] = buffer[source, :, :columns]

    def release(self) -> None:
        """Drop the buffers (their rows' K/V is lost); ``reserve`` allocates them again."""
        for layer in self.slot_layers:
            keys, values = layer.buffers()
            layer.keys, layer.values = keys[:0, :, :0].clone(), values[:0, :, :0].clone()
