"""The generation engine: token ids in, token ids out, with the statistics of every decode.

Covers plain decoding (the baseline), assisted generation with a draft model and n-gram prompt
lookup, all through transformers' ``generate``; greedy by default, speculative sampling when a
temperature is set. It must not know about Celery, the database or HTTP: the worker, the embedded
mode and the benchmarks all call it the same way.

Counting, per item (transformers calls the target once per verification round):
  - ``target_rounds``: forward passes of the target (a forward pre-hook counts them);
  - ``draft_proposed``: candidate tokens the target was asked to verify, read from the hook as
    the input length of each round minus the tokens not yet in the target's cache (the whole
    prompt in round 1, then the one token the target produced in the round before);
  - ``draft_accepted``: the streamer gets one ``put`` per round of (accepted + 1) tokens,
    after the prompt's own ``put``, so accepted = Σ (size − 1).
  Hence ``new_tokens == target_rounds + draft_accepted`` for every decode.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel
from transformers.generation.streamers import BaseStreamer

# Decoding modes and γ schedules by their job-option values (the core's DecodingMode and DraftSchedule
# are StrEnums with these values; this package does not import the core).
DRAFT, PROMPT_LOOKUP, NONE = "draft", "prompt-lookup", "none"
HEURISTIC = "heuristic"


@dataclass
class DecodeStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    target_rounds: int = 0
    draft_proposed: int = 0
    draft_accepted: int = 0
    latency_s: float = 0.0
    finish_reason: str = "length"


@dataclass
class Decoded:
    token_ids: list[int]  # the new tokens only, without the prompt
    stats: DecodeStats


@dataclass(frozen=True)
class DecodeOptions:
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


class RoundCounter(BaseStreamer):
    """Streamer that records the size of every ``put`` after the prompt's."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        self.sizes.append(int(value.numel()))

    def end(self) -> None:
        pass


@dataclass
class _TargetCalls:
    input_lengths: list[int] = field(default_factory=list)


@contextmanager
def _count_target_calls(model: PreTrainedModel) -> Iterator[_TargetCalls]:
    calls = _TargetCalls()

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs["inputs_embeds"]
        calls.input_lengths.append(int(ids.shape[1]))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


class Engine:
    """Decodes one prompt at a time with a target model and an optional draft model.

    ``draft_tokens`` (γ) is what the draft proposes per round; with the ``heuristic`` schedule
    transformers raises it by 2 after a fully accepted round and lowers it by 1 otherwise. The
    engine keeps that learned γ itself (``self.draft_tokens``) so it carries across the items of a
    job, instead of leaking into the cached draft model shared with other jobs.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        *,
        assistant: PreTrainedModel | None = None,
        mode: str = DRAFT,
        draft_tokens: int = 5,
        schedule: str = HEURISTIC,
        prompt_lookup_tokens: int = 10,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        if mode == DRAFT and assistant is None:
            raise ValueError("mode 'draft' needs an assistant model")
        self.target = target
        self.assistant = assistant if mode == DRAFT else None
        self.mode = mode
        self.draft_tokens = draft_tokens
        self.schedule = schedule
        self.prompt_lookup_tokens = prompt_lookup_tokens
        self.eos_token_id = eos_token_id if eos_token_id is not None else target.config.eos_token_id
        self.pad_token_id = pad_token_id if pad_token_id is not None else self.eos_token_id

    @property
    def device(self) -> torch.device:
        return self.target.device

    def _mode_kwargs(self, mode: str) -> dict:
        if mode == DRAFT:
            assert self.assistant is not None
            config = self.assistant.generation_config
            config.num_assistant_tokens = self.draft_tokens
            config.num_assistant_tokens_schedule = str(self.schedule)
            config.assistant_confidence_threshold = 0.0  # always propose γ tokens; γ adapts instead
            return {"assistant_model": self.assistant}
        if mode == PROMPT_LOOKUP:
            return {"prompt_lookup_num_tokens": self.prompt_lookup_tokens}
        return {}

    def generate(self, input_ids: list[int], options: DecodeOptions, *, mode: str | None = None) -> Decoded:
        """Decode one prompt; ``mode`` overrides the engine's (``none`` gives the plain baseline)."""
        mode = self.mode if mode is None else mode
        prompt = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        sampling: dict = {"do_sample": False}
        if options.temperature > 0:
            sampling = {"do_sample": True, "temperature": options.temperature, "top_p": options.top_p}
            torch.manual_seed(options.seed if options.seed is not None else 0)
        counter = RoundCounter()
        with torch.inference_mode(), _count_target_calls(self.target) as calls:
            started = time.perf_counter()
            output = self.target.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=options.max_new_tokens,
                eos_token_id=self.eos_token_id,
                pad_token_id=self.pad_token_id,
                streamer=counter,
                top_k=None,
                **sampling,
                **self._mode_kwargs(mode),
            )
            latency = time.perf_counter() - started
        if mode == DRAFT and self.schedule == HEURISTIC:
            assert self.assistant is not None
            self.draft_tokens = int(self.assistant.generation_config.num_assistant_tokens)
        new = output[0, len(input_ids) :].tolist()
        return Decoded(new, self._stats(len(input_ids), new, counter, calls, latency, mode))

    def warm_up(self, input_ids: list[int]) -> None:
        """Pay one-time costs (allocations, first-call paths) before anything is timed; γ is kept."""
        draft_tokens = self.draft_tokens
        for mode in {self.mode, NONE}:
            self.generate(input_ids, DecodeOptions(max_new_tokens=4), mode=mode)
        self.draft_tokens = draft_tokens

    def _stats(
        self,
        prompt_tokens: int,
        new: list[int],
        counter: RoundCounter,
        calls: _TargetCalls,
        latency: float,
        mode: str,
    ) -> DecodeStats:
        rounds = len(calls.input_lengths)
        if mode == NONE:
            proposed = accepted = 0
        else:
            # Round 1 feeds the prompt plus candidates; later rounds one fresh token plus candidates.
            uncached = [prompt_tokens] + [1] * (rounds - 1)
            proposed = sum(n - u for n, u in zip(calls.input_lengths, uncached, strict=True))
            accepted = sum(size - 1 for size in counter.sizes)
        finish = (
            "stop" if new and self.eos_token_id is not None and new[-1] == self.eos_token_id else "length"
        )
        return DecodeStats(
            prompt_tokens=prompt_tokens,
            new_tokens=len(new),
            target_rounds=rounds,
            draft_proposed=proposed,
            draft_accepted=accepted,
            latency_s=latency,
            finish_reason=finish,
        )


def cache_kwarg(model: PreTrainedModel) -> str:
    """The forward's cache argument: ``cache`` in newer transformers (``past_key_values`` is
    deprecated there), ``past_key_values`` in older ones; accept either."""
    return _CACHE_KWARG.setdefault(
        type(model), "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    )


_CACHE_KWARG: dict[type, str] = {}
