"""The worker's Prometheus metrics: a meter around each chunk, and the HTTP endpoint that serves them.

``metered(runner, outcome, labels)`` wraps the chunk's engine for as long as the chunk runs: after
every engine step it adds what the engine's counters gained (rounds and their latency, tokens, drafts
proposed and accepted) and what the chunk's outcome gained (items done, failed, retried) to the
metrics, and sets the rows in flight; so the series move while a chunk runs, not only when it ends.
The item loop and the engine know nothing of it. Labels: model, queue, mode, worker (no job ids).

``note_progress`` keeps each pool process's progress gauges (``genjob.worker.leasing`` calls it on
every beat): when it last made progress, whether it holds a chunk, and how long it may go without.

``serve_metrics(port)`` runs in the worker's main process: it serves what every pool process counted
(prometheus_client's multiprocess mode, set up by ``genjob worker`` before anything imports it) on
``/metrics``, and on ``/healthz`` whether its pool processes move: 200, or 503 once one has held a chunk
without progress for longer than its bound (``progress_report``), for compose's healthcheck.
Must not know: HTTP frameworks, the CLI.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from genjob.telemetry import exposition, multiprocess_registry, worker_metrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

ENGINE_COUNTERS = ("rounds", "tokens", "seconds", "probe_rounds", "proposed", "accepted", "prefill_rows")
OUTCOME_STATES = {"done": "done", "failed": "failed", "retried": "retried", "skipped": "skipped"}


@dataclass
class _Meter:
    engine: Any
    outcome: Any
    labels: tuple[str, str, str, str]
    seen: dict[str, float] = field(default_factory=dict)
    counted: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seen = self._engine_counts()
        self.counted = {name: 0 for name in OUTCOME_STATES}

    def _engine_counts(self) -> dict[str, float]:
        stats = self.engine.stats
        return {name: float(getattr(stats, name, 0)) for name in ENGINE_COUNTERS}

    def update(self) -> None:
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
            for _ in range(int(gained["rounds"])):
                metrics.round_seconds.labels(*labels).observe(per_round)
        if gained["probe_rounds"] > 0:
            metrics.probe_rounds.labels(*labels).inc(gained["probe_rounds"])
        tokens = gained["tokens"] + gained["prefill_rows"]
        if tokens > 0:
            metrics.new_tokens.labels(*labels).inc(tokens)
        if gained["proposed"] > 0:
            metrics.proposed.labels(*labels).inc(gained["proposed"])
            metrics.accepted.labels(*labels).inc(max(gained["accepted"], 0))
        for attribute, state in OUTCOME_STATES.items():
            value = int(getattr(self.outcome, attribute, 0))
            if value > self.counted[attribute]:
                metrics.items.labels(*labels, state).inc(value - self.counted[attribute])
                self.counted[attribute] = value
        metrics.rows.labels(*labels).set(int(getattr(self.engine, "busy", 0)))


@contextmanager
def metered(engine: Any, outcome: Any, *, model: str, queue: str, mode: str, worker: str) -> Iterator[None]:
    """Count the chunk running in this block into the worker's metrics (see the module's doc)."""
    meter = _Meter(engine, outcome, (model, queue, mode, worker))
    step: Callable[[], list[Any]] = engine.step

    def counted_step() -> list[Any]:
        try:
            return step()
        finally:
            meter.update()

    engine.step = counted_step
    try:
        yield
    finally:
        del engine.step  # the class's own step again
        try:
            meter.update()
            worker_metrics().rows.labels(*meter.labels).set(0)
            failed = "with_failures" if outcome.failed else "clean"
            worker_metrics().chunks.labels(queue, worker, "stopped" if outcome.stopped else failed).inc()
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


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            report = progress_report(multiprocess_registry())
            status = 200 if report["status"] == "ok" else 503
            self._answer(status, json.dumps(report).encode(), "application/json")
        elif path in ("/metrics", "/"):
            self._answer(200, *exposition(multiprocess_registry()))
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
