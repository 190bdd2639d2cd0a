"""The generation package: decoding with speculation, token ids in, token ids out.

One engine (``engine``) for every batch size and mode, proposers behind one interface (``proposers``,
``draft_model``), keyed sampling and the acceptance rule (``sampling``), the slot cache and the batched
forward (``slot_cache``, ``forward``), the device's costs and the choice of γ (``costs``), the costs
kept on disk (``cost_cache``), model loading (``loading``) and stop strings (``stopping``). Must not
know: the database, Celery, HTTP, or genjob's core (its tables, options and settings).
"""
