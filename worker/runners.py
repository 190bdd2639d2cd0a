"""A job's runner in a worker process: its models, tokenizer and engine, built once per job and cached.

Encodes prompts (checking the model's context), decodes one item (with its plain baseline on the
sampled items of the A/B) and shapes the result row. Must not know: Celery, the SQL of the store.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from threading import Lock
from typing import Any

from genjob.constants import DecodingMode
from genjob.generation.costs import cost_ratio
from genjob.generation.engine import Decoded, DecodeOptions, Engine
from genjob.generation.loading import check_same_vocabulary, load_model, load_tokenizer
from genjob.options import JobSpec
from genjob.tables import Item

log = logging.getLogger(__name__)


MAX_CACHED_ENGINES = 16
WARM_UP_PROMPT = "def main():\n    "


class PromptTooLong(ValueError):
    pass


# Errors that another try cannot fix: the item fails at once.
PERMANENT_ITEM_ERRORS: tuple[type[Exception], ...] = (PromptTooLong,)


@dataclass
class JobRunner:
    """A job's tokenizer and engine; the engine keeps the job's learned draft length across chunks."""

    spec: JobSpec
    engine: Engine
    tokenizer: Any  # a transformers tokenizer (or a test double)
    max_positions: int | None
    cost_ratio: float | None

    @classmethod
    def build(cls, spec: JobSpec, *, device: str, draft_tokens: int | None = None) -> JobRunner:
        target = load_model(spec.model, device)
        assistant = None
        if spec.mode is DecodingMode.DRAFT:
            assert spec.assistant is not None
            check_same_vocabulary(spec.model, spec.assistant)
            assistant = load_model(spec.assistant, device)
        tokenizer = load_tokenizer(spec.model)
        engine = Engine(
            target,
            assistant=assistant,
            mode=spec.mode,
            draft_tokens=draft_tokens or spec.draft_tokens,
            schedule=spec.schedule,
            prompt_lookup_tokens=spec.prompt_lookup_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        config = target.config
        positions = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
        warm_up_ids = tokenizer(WARM_UP_PROMPT)["input_ids"]
        engine.warm_up(warm_up_ids)
        ratio = {DecodingMode.DRAFT: None, DecodingMode.PROMPT_LOOKUP: 0.0, DecodingMode.NONE: None}[
            spec.mode
        ]
        if assistant is not None:
            ratio = cost_ratio(target, assistant, warm_up_ids)
        return cls(spec=spec, engine=engine, tokenizer=tokenizer, max_positions=positions, cost_ratio=ratio)

    def encode(self, prompt: str, max_new_tokens: int) -> list[int]:
        ids = self.tokenizer(prompt)["input_ids"]
        if self.max_positions is not None and len(ids) + max_new_tokens > self.max_positions:
            raise PromptTooLong(
                f"prompt of {len(ids)} tokens + max_new_tokens {max_new_tokens} exceeds the model's "
                f"context of {self.max_positions} tokens"
            )
        return ids

    def options(self, item: Item) -> DecodeOptions:
        return DecodeOptions(
            max_new_tokens=item.max_new_tokens or self.spec.max_new_tokens,
            temperature=self.spec.temperature,
            top_p=self.spec.top_p,
            seed=None if self.spec.seed is None else self.spec.seed + item.seq,
        )

    def is_baseline_sample(self, seq: int) -> bool:
        if self.spec.mode is DecodingMode.NONE or self.spec.baseline_fraction <= 0:
            return False
        return seq % max(1, round(1 / self.spec.baseline_fraction)) == 0

    def decode(self, item: Item, *, plain_only: bool = False) -> ItemOutput:
        """Decode one item; on sampled items also run the plain baseline for the A/B."""
        options = self.options(item)
        ids = self.encode(item.prompt, options.max_new_tokens)
        mode = DecodingMode.NONE if plain_only else self.spec.mode
        decoded = self.engine.generate(ids, options, mode=mode)
        baseline = None
        if not plain_only and self.is_baseline_sample(item.seq):
            baseline = self.engine.generate(ids, options, mode=DecodingMode.NONE)
        if baseline is not None and not self.spec.do_sample and baseline.token_ids != decoded.token_ids:
            log.warning(
                "item %s: assisted output differs from plain greedy: %s vs %s",
                item.seq,
                decoded.token_ids,
                baseline.token_ids,
            )
        text = self.tokenizer.decode(decoded.token_ids, skip_special_tokens=True)
        return ItemOutput(
            decoded=decoded, text=text, mode=mode, baseline=baseline, greedy=not self.spec.do_sample
        )


@dataclass
class ItemOutput:
    decoded: Decoded
    text: str
    mode: DecodingMode
    baseline: Decoded | None
    greedy: bool

    def result_row(self, worker: str) -> dict:
        stats = self.decoded.stats
        row = {
            "output": self.text,
            "finish_reason": stats.finish_reason,
            "mode": self.mode.value,
            "prompt_tokens": stats.prompt_tokens,
            "new_tokens": stats.new_tokens,
            "target_rounds": stats.target_rounds,
            "draft_proposed": stats.draft_proposed,
            "draft_accepted": stats.draft_accepted,
            "latency_s": stats.latency_s,
            "baseline_latency_s": None,
            "baseline_match": None,
            "worker": worker,
        }
        if self.baseline is not None:
            row["baseline_latency_s"] = self.baseline.stats.latency_s
            if self.greedy:
                row["baseline_match"] = self.baseline.token_ids == self.decoded.token_ids
        return row


class RunnerCache:
    """Per-process cache of job runners (models themselves are cached by name in ``loading``).

    ``build`` makes a job's runner: ``JobRunner.build`` in production; tests swap in a stand-in
    (a fixture in-process; ``tests/doubles/scripted_worker.py`` in a test worker process)."""

    def __init__(self, build: Callable[..., Any], size: int = MAX_CACHED_ENGINES) -> None:
        self.build = build
        self._runners: OrderedDict[str, Any] = OrderedDict()
        self._size = size
        self._lock = Lock()

    def get(
        self,
        job_id: str,
        spec: JobSpec,
        *,
        device: str,
        draft_tokens: int | None,
    ) -> JobRunner:
        with self._lock:
            runner = self._runners.get(job_id)
            if runner is None:
                runner = self.build(spec, device=device, draft_tokens=draft_tokens)
                self._runners[job_id] = runner
                while len(self._runners) > self._size:
                    self._runners.popitem(last=False)
            self._runners.move_to_end(job_id)
            return runner


RUNNERS = RunnerCache(JobRunner.build)
