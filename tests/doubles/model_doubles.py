"""A stand-in for the models (``RUNNERS.build = scripted_runner``, see scripted_worker.py): the rest is real.

Its "generation" echoes the prompt and obeys directives written in it, so one worker serves many
tests and each item decides its own behaviour:

  ``sleep=0.4``          take 0.4 s (a slow item, so kills and cancels land mid-chunk)
  ``poison``             always raise
  ``poison-while=PATH``  raise while the file PATH exists (then a retry succeeds)
  ``pid-file=PATH``      write this process's pid to PATH before working (to kill it there)

With no directive an item takes no time at all (the no-op engine of the large-job benchmark).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from genjob.constants import DecodingMode
from genjob.generation.engine import Decoded, DecodeStats
from genjob.options import JobSpec
from genjob.tables import Item
from genjob.worker.runners import ItemOutput

DIRECTIVE = re.compile(r"\b(sleep|poison-while|pid-file)=(\S+)|\b(poison)\b")


class PoisonError(RuntimeError):
    pass


@dataclass
class _EngineState:
    draft_tokens: int


@dataclass
class ScriptedRunner:
    """The interface of genjob.worker.chunks.JobRunner that process_chunk uses."""

    spec: JobSpec
    engine: _EngineState
    cost_ratio: float | None = None

    def decode(self, item: Item, *, plain_only: bool = False) -> ItemOutput:
        started = time.perf_counter()
        for key, value, poison in DIRECTIVE.findall(item.prompt):
            if poison or (key == "poison-while" and Path(value).exists()):
                raise PoisonError(f"poisoned item {item.seq}")
            if key == "pid-file":
                Path(value).write_text(str(os.getpid()))
            if key == "sleep":
                time.sleep(float(value))
        stats = DecodeStats(
            prompt_tokens=len(item.prompt.split()),
            new_tokens=1,
            target_rounds=1,
            latency_s=time.perf_counter() - started,
        )
        mode = DecodingMode.NONE if plain_only else self.spec.mode
        decoded = Decoded(token_ids=[0], stats=stats)
        return ItemOutput(decoded=decoded, text=f"echo: {item.prompt}", mode=mode, baseline=None, greedy=True)


def scripted_runner(spec: JobSpec, *, device: str, draft_tokens: int | None = None) -> ScriptedRunner:
    return ScriptedRunner(spec=spec, engine=_EngineState(draft_tokens=draft_tokens or spec.draft_tokens))
