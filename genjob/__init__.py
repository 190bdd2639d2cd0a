"""genjob: batch LLM generation jobs made fast with assisted generation (speculative decoding).

The core (this package's own modules: settings, tables, the store, job options, formats, stats) knows
no torch, transformers, worker, API or CLI. A word with one meaning per package: in the core and the
API, a *batch* is an OpenAI Batch (``genjob.batches``); in ``genjob.generation`` and the worker, the
*batch* is the rows the engine decodes together (its size: ``--batch-size``); what goes together
into one statement or one round trip is named by its count (``ROWS_PER_INSERT``, ``MESSAGES_PER_PUBLISH``).
"""

__version__ = "0.1.0"
