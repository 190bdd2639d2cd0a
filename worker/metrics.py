"""The worker's Prometheus metrics: a meter around each chunk, and the HTTP endpoint that serves them.

``metered(runner, outcome, labels)`` wraps the chunk's engine for as long as the chunk runs: after
every engine step it adds what the engine's counters gained (rounds with their latency and rows,
tokens, prefill tokens, drafts proposed and accepted), the latency of the items that finished, and
what the chunk's outcome gained (items done, failed, retried) to the metrics, and sets the rows in
flight, the tokens per second and the acceptance rate over the last ``RATE_WINDOW_S`` of rounds; so
the series move while a chunk runs, not only when it ends. The item loop and the engine know nothing
of it. Labels: model, queue, mode, worker (no job ids); ``model`` is the catalog's name for the
model where it has one (``model_label``), never a server path.

``note_runner_built`` times what a worker spends making a job's runner: its model loads and its cost
calibration, apart.

``note_swept_items`` counts what a sweep did to items (queued again after a lost try: retried; out of
tries: failed), by model, in the process that sweeps (the worker's main process).

``note_progress`` keeps each pool process's progress gauges (``genjob.worker.leasing`` calls it on
every beat): when it last made progress, whether it holds a chunk, and how long it may go without.

``serve_metrics(port)`` runs in the worker's main process: it serves what every pool process counted
(prometheus_client's multiprocess mode, set up by ``genjob worker`` before anything imports it) on
``/metrics`` (with ``genjob_worker_stalled_processes``), and on ``/healthz`` whether its pool processes
move: 200, or 503 once one has held a chunk without progress for longer than its bound
(``progress_report``), for compose's healthcheck.
Must not know: HTTP frameworks, the CLI.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from genjob.formats.openai_output import model_label as short_model_name
from genjob.generation.requests import Finished
from genjob.telemetry import RATE_WINDOW_S, exposition, multiprocess_registry, worker_metrics
from genjob.worker.chunk_context import ChunkOutcome

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from genjob.generation.engine import Engine

log = logging.getLogger(__name__)

ENGINE_COUNTERS = (
    "rounds",
    "rows_sum",
    "tokens",
    "seconds",
    "probe_rounds",
    "proposed",
    "accepted",
    "prefill_rows",
    "prefill_tokens",
)
MAX_MODEL_LABELS = 32  # models outside the catalog a process names; past it they are "other"


@lru_cache(maxsize=1)
def _catalog_names() -> dict[str, str]:
    """The catalog's models as workers load them (absolute targets, and as listed) → their names."""
    from genjob.catalog import resolve_model
    from genjob.settings import get_settings

    names: dict[str, str] = {}
    try:
        settings = get_settings()
        for entry in settings.catalog:
            names.setdefault(entry.target, entry.name)
            try:
                names.setdefault(resolve_model(settings, entry.name, allow_paths=False).target, entry.name)
            except Exception:  # a package: entry whose package is not installed here, say
                continue
    except Exception as exc:  # metrics never stop a chunk
        log.warning("metrics: cannot read the model catalog: %s", exc)
    return names


_OTHER_MODELS: set[str] = set()


def model_label(model: str) -> str:
    """The ``model`` label of a job's model (a path or hub id, as on the job): its catalog name where
    it has one; else a hub id as is, a path by its last part; past ``MAX_MODEL_LABELS`` of those,
    ``other`` (labels stay a bounded set)."""
    name = _catalog_names().get(model)
    if name is not None:
        return name
    label = short_model_name(model)
    if label not in _OTHER_MODELS and len(_OTHER_MODELS) >= MAX_MODEL_LABELS:
        return "other"
    _OTHER_MODELS.add(label)
    return label


@dataclass
class _Meter:
    engine: Engine
    outcome: ChunkOutcome
    labels: tuple[str, str, str, str]
    seen: dict[str, float] = field(default_factory=dict)
    counted: dict[str, int] = field(default_factory=dict)
    # (time, tokens, proposed, accepted) summed since the chunk began: the rates' window
    window: deque[tuple[float, float, float, float]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.seen = self._engine_counts()
        self.counted = dict.fromkeys(self.outcome.counts(), 0)
        self.window.append((time.monotonic(), 0.0, 0.0, 0.0))

    def _engine_counts(self) -> dict[str, float]:
        stats = self.engine.stats
        return {name: float(getattr(stats, name, 0)) for name in ENGINE_COUNTERS}

    def update(self, finished: Sequence[Finished] = ()) -> None:
        metrics, labels = worker_metrics(), self.labels
        now = self._engine_counts()
        # A counter smaller than last time was reset (``take`` at a chunk's end): all of it is new.
        gained = {
            name: now[name] - self.seen[name] if now[name] >= self.seen[name] else now[name] for name in now
        }
        self.seen = now
        if gained["rounds"] > 0:
            metrics.rounds.labels(*labels).inc(gained["rounds"])
            per_round = gained["seconds"] / gained["rounds"]
            rows = gained["rows_sum"] / gained["rounds"]
            for _ in range(int(gained["rounds"])):
                metrics.round_seconds.labels(*labels).observe(per_round)
                metrics.round_rows.labels(*labels).observe(rows)
        if gained["probe_rounds"] > 0:
            metrics.probe_rounds.labels(*labels).inc(gained["probe_rounds"])
        tokens = gained["tokens"] + gained["prefill_rows"]
        if tokens > 0:
            metrics.new_tokens.labels(*labels).inc(tokens)
        if gained["prefill_tokens"] > 0:
            metrics.prefill_tokens.labels(*labels).inc(gained["prefill_tokens"])
        if gained["proposed"] > 0:
            metrics.proposed.labels(*labels).inc(gained["proposed"])
            metrics.accepted.labels(*labels).inc(max(gained["accepted"], 0))
        for row in finished:
            if row.key >= 0:  # a lossless check's twin (negative key) is no item
                metrics.item_seconds.labels(*labels).observe(row.stats.wall_s)
        self._rates(tokens, gained["proposed"], max(gained["accepted"], 0))
        for state, value in self.outcome.counts().items():
            if value > self.counted[state]:
                metrics.items.labels(*labels, state).inc(value - self.counted[state])
                self.counted[state] = value
        metrics.rows.labels(*labels).set(self.engine.busy)

    def _rates(self, tokens: float, proposed: float, accepted: float) -> None:
        """Tokens per second and acceptance over the window's rounds, as gauges."""
        _, total, drafted, kept = self.window[-1]
        now = time.monotonic()
        self.window.append((now, total + tokens, drafted + proposed, kept + accepted))
        while len(self.window) > 2 and self.window[1][0] <= now - RATE_WINDOW_S:
            self.window.popleft()
        first, last = self.window[0], self.window[-1]
        metrics, labels = worker_metrics(), self.labels
        if last[0] > first[0]:
            metrics.tokens_per_second.labels(*labels).set((last[1] - first[1]) / (last[0] - first[0]))
        if last[2] > first[2]:
            metrics.acceptance.labels(*labels).set((last[3] - first[3]) / (last[2] - first[2]))


@contextmanager
def metered(
    engine: Engine, outcome: ChunkOutcome, *, model: str, queue: str, mode: str, worker: str
) -> Iterator[None]:
    """Count the chunk running in this block into the worker's metrics (see the module's doc);
    ``model``: as the job names it (a path or hub id), labelled by ``model_label``."""
    meter = _Meter(engine, outcome, (model_label(model), queue, mode, worker))
    step: Callable[[], list[Finished]] = engine.step

    def counted_step() -> list[Finished]:
        finished: list[Finished] = []
        try:
            finished = step()
            return finished
        finally:
            meter.update(finished)

    engine.step = counted_step  # type: ignore[method-assign]  # for as long as the chunk runs
    faulted = False
    try:
        yield
    except BaseException:
        faulted = True  # the worker failed holding the chunk (its items' tries are counted as lost)
        raise
    finally:
        del engine.step  # the class's own step again
        try:
            meter.update()
            worker_metrics().rows.labels(*meter.labels).set(0)
            worker_metrics().tokens_per_second.labels(*meter.labels).set(0)
            failed = "with_failures" if outcome.failed else "clean"
            ended = "faulted" if faulted else "stopped" if outcome.stopped else failed
            worker_metrics().chunks.labels(*meter.labels, ended).inc()
        except Exception as exc:  # metrics never stop a chunk
            log.warning("metrics: %s", exc)


def note_swept_items(
    jobs: dict[str, tuple[str, str, str]], *, worker: str, retried: dict[str, int], failed: dict[str, int]
) -> None:
    """A sweep queued ``retried`` items again (their try was lost: a worker died, stalled or faulted)
    and failed ``failed`` ones for good (out of tries), by job id; ``jobs``: each job's (model, queue,
    mode). Counted in ``genjob_items_total`` by model, as a chunk's own retries and failures are."""
    try:
        items = worker_metrics().items
        for state, counts in (("retried", retried), ("failed", failed)):
            for job_id, count in counts.items():
                if count and job_id in jobs:
                    model, queue, mode = jobs[job_id]
                    items.labels(model_label(model), queue, mode, worker, state).inc(count)
    except Exception as exc:  # metrics never stop a sweep
        log.warning("metrics: %s", exc)


def note_runner_built(spec: Any, seconds: float, calibration_s: float) -> None:
    """A job's runner took ``seconds`` to make here, ``calibration_s`` of them measuring costs (0: read
    from the cost cache, or plain decoding): the rest is loading its models and tokenizer."""
    try:
        labels = (model_label(str(spec.model)), str(getattr(spec.mode, "value", spec.mode)))
        metrics = worker_metrics()
        metrics.model_load_seconds.labels(*labels).observe(max(0.0, seconds - calibration_s))
        if calibration_s > 0:
            metrics.calibration_seconds.labels(*labels).observe(calibration_s)
    except Exception as exc:  # metrics never stop a chunk
        log.warning("metrics: %s", exc)


@lru_cache(maxsize=16)
def _progress_series(worker: str) -> tuple[Any, Any, Any]:
    metrics = worker_metrics()
    series = (metrics.progress_at, metrics.holding, metrics.stall_bound)
    at, holding, bound = (gauge.labels(worker) for gauge in series)
    return at, holding, bound


def note_progress(worker: str, *, bound_s: float, holding: bool | None = None) -> None:
    """This process made progress now and may go ``bound_s`` without more; ``holding``: it took its
    first chunk (True) or let go of its last (False)."""
    try:
        at, held, bound = _progress_series(worker)
        at.set(time.time())
        bound.set(bound_s)
        if holding is not None:
            held.set(1 if holding else 0)
    except Exception as exc:  # metrics never stop a chunk
        log.warning("metrics: %s", exc)


PROGRESS_SERIES = {
    "genjob_worker_progress_timestamp_seconds": "at",
    "genjob_worker_holding_chunk": "holding",
    "genjob_worker_stall_bound_seconds": "bound_s",
}


def progress_report(registry: CollectorRegistry, now: float | None = None) -> dict[str, Any]:
    """Each live pool process's progress from its gauges: ``{"status": "ok" | "stalled", "processes":
    [{"pid", "holding", "since_progress_s", "bound_s", "stalled"}]}``; stalled: it holds a chunk and
    made no progress for longer than its bound."""
    now = time.time() if now is None else now
    by_pid: dict[str, dict[str, float]] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name in PROGRESS_SERIES:
                values = by_pid.setdefault(sample.labels.get("pid", "this"), {})
                values[PROGRESS_SERIES[sample.name]] = sample.value
    processes = []
    for pid, values in sorted(by_pid.items()):
        holding = values.get("holding", 0.0) > 0
        since = max(0.0, now - values.get("at", now))
        bound = values.get("bound_s", float("inf"))
        processes.append(
            {
                "pid": int(pid) if pid.isdigit() else pid,
                "holding": holding,
                "since_progress_s": round(since, 3),
                "bound_s": bound,
                "stalled": holding and since > bound,
            }
        )
    stalled = any(process["stalled"] for process in processes)
    return {"status": "stalled" if stalled else "ok", "processes": processes}


def stalled_exposition(report: dict[str, Any]) -> bytes:
    """``genjob_worker_stalled_processes``: the pool processes that hold a chunk without progress for
    longer than their bound (``progress_report``; the same that make ``/healthz`` answer 503)."""
    stalled = sum(1 for process in report["processes"] if process["stalled"])
    return (
        "# HELP genjob_worker_stalled_processes Pool processes holding a chunk without progress past "
        "their bound (GENJOB_ROUND_STALL_S).\n"
        "# TYPE genjob_worker_stalled_processes gauge\n"
        f"genjob_worker_stalled_processes {stalled}\n"
    ).encode()


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            report = progress_report(multiprocess_registry())
            status = 200 if report["status"] == "ok" else 503
            self._answer(status, json.dumps(report).encode(), "application/json")
        elif path in ("/metrics", "/"):
            registry = multiprocess_registry()
            body, content_type = exposition(registry)
            self._answer(200, body + stalled_exposition(progress_report(registry)), content_type)
        else:
            self.send_error(404)

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics: " + format, *args)


def serve_metrics(port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve ``/metrics`` and ``/healthz`` from a daemon thread of this (the main) process; returns it."""
    server = ThreadingHTTPServer((host, port), _MetricsHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="genjob-metrics", daemon=True)
    thread.start()
    log.info("metrics on http://%s:%d/metrics", host, port)
    return server
