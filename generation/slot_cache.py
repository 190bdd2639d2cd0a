"""The slot cache of batched decoding: B slots of preallocated K/V, each row at its own length.

Row i holds the K/V of all its tokens but the last in columns 0..lengths_i-1; a forward of q new
tokens writes row i's K/V at columns lengths_i..lengths_i+q-1 (one indexed write per layer, no
concatenation). See ``genjob.generation.batched`` for the layout's reasons. Token ids and tensors
only: must not know the database, Celery or HTTP.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class _Cursor:
    """Where the current forward writes: (B, q) row and column indices, and the columns it reads."""

    rows: torch.Tensor
    columns: torch.Tensor
    width: int


class _SlotLayer(DynamicLayer):
    """One layer's K/V for every slot in buffers (B, heads, capacity, head_dim). ``update`` writes
    the q new columns of row i at columns lengths_i .. lengths_i + q - 1 and returns the first
    ``width`` columns (views, no copy); columns past a row's length are stale and masked."""

    def __init__(self, cursor: _Cursor, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.cursor, self.keys, self.values = cursor, keys, values
        self.device, self.is_initialized = keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        cursor = self.cursor  # key_states (B, heads, q, head_dim) -> (B, q, heads, head_dim) slots
        self.keys.transpose(1, 2)[cursor.rows, cursor.columns] = key_states.transpose(1, 2)
        self.values.transpose(1, 2)[cursor.rows, cursor.columns] = value_states.transpose(1, 2)
        return self.keys[:, :, : cursor.width], self.values[:, :, : cursor.width]

    def get_seq_length(self) -> int:
        return self.cursor.width


class SlotCache(Cache):
    """A transformers ``Cache`` of B slots; every forward appends at each row's own length."""

    def __init__(self, template: DynamicCache, slots: int, capacity: int) -> None:
        self.cursor = _Cursor()
        layers = []
        for layer in template.layers:  # (1, heads, L, head_dim) from a prefill
            shape = (slots, layer.keys.shape[1], capacity, layer.keys.shape[3])
            zeros = [layer.keys.new_zeros(shape), layer.values.new_zeros(shape)]  # zeros: finite
            layers.append(_SlotLayer(self.cursor, *zeros))
        super().__init__(layers=layers)

    @property
    def capacity(self) -> int:
        return self.layers[0].keys.shape[2]

    def place(self, slot: int, prefilled: DynamicCache) -> None:
        """Copy a single prompt's prefill cache into columns 0..L-1 of ``slot``."""
        for layer, source in zip(self.layers, prefilled.layers, strict=True):
            length = source.keys.shape[2]
            layer.keys[slot, :, :length] = source.keys[0]
            layer.values[slot, :, :length] = source.values[0]

    def resize(self, slots: torch.Tensor, capacity: int) -> None:
        """Keep the slots ``slots`` (in that order; -1 = a new empty slot), with ``capacity`` columns."""
        for layer in self.layers:
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = old.new_zeros(len(slots), old.shape[1], capacity, old.shape[3])
                kept = slots >= 0
                width = min(capacity, old.shape[2])
                new[kept, :, :width] = old[slots[kept], :, :width]
                setattr(layer, name, new)
