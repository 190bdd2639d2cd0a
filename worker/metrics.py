"""The worker's Prometheus metrics: a meter around each chunk, and the HTTP endpoint that serves them.

``metered(runner, outcome, labels)`` wraps the chunk's engine for as long as the chunk runs: after
every engine step it adds what the engine's counters gained (rounds and their latency, tokens, drafts
proposed and accepted) and what the chunk's outcome gained (items done, failed, retried) to the
metrics, and sets the rows in flight; so the series move while a chunk runs, not only when it ends.
The item loop and the engine know nothing of it. Labels: model, queue, mode, worker (no job ids).

``serve_metrics(port)`` runs in the worker's main process: it serves what every pool process counted
(prometheus_client's multiprocess mode, set up by ``genjob worker`` before anything imports it).
Must not know: HTTP frameworks, the CLI.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from genjob.telemetry import exposition, multiprocess_registry, worker_metrics

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


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        body, content_type = exposition(multiprocess_registry())
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics: " + format, *args)


def serve_metrics(port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve ``/metrics`` from a daemon thread of this (the main) process; returns the server."""
    server = ThreadingHTTPServer((host, port), _MetricsHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="genjob-metrics", daemon=True)
    thread.start()
    log.info("metrics on http://%s:%d/metrics", host, port)
    return server
