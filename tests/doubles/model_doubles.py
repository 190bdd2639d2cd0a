"""A stand-in for the models (``PROCESS.runners.build = scripted_runner``, see scripted_worker.py): the
rest is real.

Its "engine" echoes the prompt and obeys directives written in it, so one worker serves many tests
and each item decides its own behaviour:

  ``sleep=0.4``          take 0.4 s a step (a slow item, so kills and cancels land mid-chunk)
  ``rounds=30``          stay in the batch for 30 steps before it finishes (rows in flight for a while)
  ``poison``             always raise
  ``poison-while=PATH``  raise while the file PATH exists (then a retry succeeds)
  ``pid-file=PATH``      write this process's pid to PATH before working (to kill it there)
  ``hold-while=PATH``    wait while the file PATH exists (a job that cannot end before the test lets it)
  ``hang-once=PATH``     the first process to get here creates PATH and hangs for good inside the round
                         (a lock taken twice, as a pool process deadlocked in C code); later tries pass
  ``cuda-error-once=PATH`` the first process to get here writes its pid to PATH and raises a sticky CUDA
                         error (an illegal memory access), as does every later step in that process;
                         other processes pass

With no directive an item takes no time at all (the no-op engine of the pipeline benchmarks).
Each step finishes every row it holds (up to the batch size), through the same item loop as the real
engine; a row that raises loses the whole batch, as a real batch would.

A job whose model is named ``scripted-broken`` cannot start on this worker (out of memory in its
warm-up): building its runner raises, a fault of the worker, not of the job.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from genjob.generation.engine_stats import EngineStats
from genjob.generation.requests import Finished, Request, RowStats
from genjob.options import JobSpec
from genjob.settings import Settings
from genjob.store.claims import ClaimedItem

DIRECTIVE = re.compile(
    r"\b(sleep|poison-while|pid-file|hold-while|hang-once|cuda-error-once|rounds)=(\S+)|\b(poison)\b"
)
ILLEGAL_ADDRESS = (
    "CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect."
)
DEVICE_BROKEN: list[str] = []  # this process's sticky error, once it had one


class PoisonError(RuntimeError):
    pass


def break_the_device_once(marker: Path) -> None:
    """The first caller (across processes) breaks this process's "device" for good."""
    try:
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(descriptor, str(os.getpid()).encode())
    os.close(descriptor)
    DEVICE_BROKEN.append(ILLEGAL_ADDRESS)


def hang_the_first_time(marker: Path) -> None:
    """The first caller (across processes: ``marker`` is created exclusively) never returns."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    deadlock = threading.Lock()
    deadlock.acquire()
    deadlock.acquire()  # never returns: no round ends, no beat comes


@dataclass
class ScriptedEngine:
    """The interface of genjob.generation.engine.Engine that the item loop uses."""

    max_rows: int = 1
    prompts: dict[int, str] = field(default_factory=dict)
    seqs: dict[int, int] = field(default_factory=dict)
    queue: deque[Request] = field(default_factory=deque)
    steps: dict[int, int] = field(default_factory=dict)  # row key -> steps it has been in
    stats: EngineStats = field(default_factory=EngineStats)
    k: int = 0
    proposer: None = None
    costs: None = None  # nothing measured: nothing to derive

    @property
    def busy(self) -> int:
        return len(self.queue)

    @property
    def free_rows(self) -> int:
        return max(0, self.max_rows - self.busy)

    def add(self, requests: list[Request]) -> None:
        self.queue.extend(requests)

    def abandon(self) -> list[int]:
        keys = [request.key for request in self.queue]
        self.queue.clear()
        self.steps.clear()
        return keys

    def step(self) -> list[Finished]:
        rows = [self.queue[index] for index in range(min(self.max_rows, len(self.queue)))]
        started = time.perf_counter()
        for request in rows:
            if DEVICE_BROKEN:  # sticky: nothing runs on this process's device any more
                raise RuntimeError(DEVICE_BROKEN[0])
            prompt = self.prompts[abs(request.key)]
            for key, value, poison in DIRECTIVE.findall(prompt):
                if poison or (key == "poison-while" and Path(value).exists()):
                    raise PoisonError(f"poisoned item {self.seqs[abs(request.key)]}")
                if key == "pid-file":
                    Path(value).write_text(str(os.getpid()))
                if key == "sleep":
                    time.sleep(float(value))
                while key == "hold-while" and Path(value).exists():
                    time.sleep(0.05)
                if key == "hang-once":
                    hang_the_first_time(Path(value))
                if key == "cuda-error-once":
                    break_the_device_once(Path(value))
                    if DEVICE_BROKEN:
                        raise RuntimeError(DEVICE_BROKEN[0])
        finished = []
        seconds = time.perf_counter() - started
        for request in rows:
            self.queue.popleft()
            prompt = self.prompts[abs(request.key)]
            wanted = [int(value) for key, value, _ in DIRECTIVE.findall(prompt) if key == "rounds"]
            self.steps[request.key] = self.steps.get(request.key, 0) + 1
            if wanted and self.steps[request.key] < wanted[0]:
                self.queue.append(request)  # in flight for another step
                continue
            self.steps.pop(request.key, None)
            stats = RowStats(prompt_tokens=len(prompt.split()), new_tokens=1, target_rounds=1)
            stats.latency_s = seconds / len(rows)
            finished.append(
                Finished(key=request.key, token_ids=[abs(request.key)], stats=stats)
            )  # "token": the item
        self.stats.round(
            batch=len(rows),
            k=0,
            probe=False,
            tokens=len(rows),
            seconds=seconds,
            proposed=0,
            accepted=0,
            rejections=0,
            drafts=[0] * len(rows),
        )
        return finished


@dataclass
class ScriptedRunner:
    """A ``genjob.worker.chunk_context.Runner``, as ``genjob.worker.runners.JobRunner`` is one."""

    spec: JobSpec
    engine: ScriptedEngine
    batch_size: int = 1
    setup_extra_s: float = 0.0  # nothing measured

    def request(self, item: ClaimedItem, *, key: int | None = None, plain: bool = False) -> Request:
        self.engine.prompts[item.id] = item.prompt
        self.engine.seqs[item.id] = item.seq
        return Request(key=item.id if key is None else key, input_ids=[0], max_new_tokens=1)

    def is_lossless_sample(self, seq: int) -> bool:
        return False

    def release(self) -> None:  # no K/V caches to give back
        pass

    def learn(self, done: Finished) -> None:  # no job cache to fill
        pass

    def text(self, tokens: list[int]) -> str:
        return f"echo: {self.engine.prompts[tokens[0]]}"

    def take_setup_extra(self) -> float:
        return 0.0

    def keep_costs(self) -> None:  # no costs learnt
        pass


class WarmUpOutOfMemory(RuntimeError):
    pass


def scripted_runner(spec: JobSpec, *, settings: Settings) -> ScriptedRunner:
    if spec.model == "scripted-broken":
        raise WarmUpOutOfMemory("CUDA out of memory in warm-up (tried to allocate 80.00 GiB)")
    batch = spec.batch_size or settings.batch_size or 1
    return ScriptedRunner(spec=spec, engine=ScriptedEngine(max_rows=batch), batch_size=batch)
