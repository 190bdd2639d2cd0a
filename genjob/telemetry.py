"""Prometheus metrics: their names and labels (one place), multiprocess set-up, and exposition.

Workers count what they do (items by final state and their latency, tokens, prefill tokens, drafts
proposed and accepted, rounds with their latency and rows, rows in flight, model loads and cost
calibrations, each pool process's last progress) and gauge what a dashboard graphs as is (tokens per
second and acceptance rate over the last ``RATE_WINDOW_S``) in their pool processes;
``prometheus_client``'s multiprocess mode adds the processes up from files in
``PROMETHEUS_MULTIPROC_DIR``, which ``prepare_multiprocess`` sets before the library is first
imported. Scrape-time gauges read the database and the broker (``StateCollector``: jobs by status,
open items and queue depth per queue); ``BuildInfo`` is ``genjob_build_info{version}``, on the API's
and the worker's endpoints.

Labels are bounded sets only: model (a catalog name where there is one), queue, mode, worker, state,
and ``pid`` on the per-process
progress gauges (never a job or item id); per-job figures are in the database (``genjob status``,
``job_stats``). Processes that only submit (the CLI, the API's producer) create no worker series.
Must not know: torch, the worker's code, HTTP, the CLI.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
WORKER_LABELS = ("model", "queue", "mode", "worker")
ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
ITEM_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SETUP_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
SETUP_LABELS = ("model", "mode")
RATE_WINDOW_S = 30.0  # the gauges' rates are over this much of the latest rounds (as ``genjob wait``)


def prepare_multiprocess(directory: str | None = None) -> Path:
    """Point prometheus_client at a clean directory for this worker's processes (before it is imported).

    ``directory`` (or an inherited PROMETHEUS_MULTIPROC_DIR) is emptied of old files, as the library
    asks; without either, a fresh temporary directory is made.
    """
    chosen = directory or os.environ.get(MULTIPROC_ENV)
    path = Path(chosen) if chosen else Path(tempfile.mkdtemp(prefix="genjob-metrics-"))
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.db"):
        old.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    return path


def forget_multiprocess(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


class WorkerMetrics:
    """The worker's metric families (created on first use, in whichever process counts)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        labels = WORKER_LABELS
        self.items = Counter(
            "genjob_items",
            "Items a worker ended or handed back, by state: done, failed (for good, in a chunk or given up "
            "by the sweeper after their last try), retried (a try failed or was lost, another follows), "
            "skipped.",
            (*labels, "state"),
        )
        self.new_tokens = Counter("genjob_new_tokens", "Tokens the engine produced.", labels)
        self.prefill_tokens = Counter("genjob_prefill_tokens", "Prompt tokens the engine prefilled.", labels)
        self.proposed = Counter("genjob_draft_tokens_proposed", "Draft tokens proposed.", labels)
        self.accepted = Counter("genjob_draft_tokens_accepted", "Draft tokens the target accepted.", labels)
        self.rounds = Counter("genjob_rounds", "Decoding rounds (target forward passes).", labels)
        self.probe_rounds = Counter(
            "genjob_probe_rounds", "Rounds decoded plainly to measure the speedup.", labels
        )
        self.round_seconds = Histogram(
            "genjob_round_seconds", "Seconds per decoding round.", labels, buckets=ROUND_BUCKETS
        )
        self.round_rows = Histogram(
            "genjob_round_rows",
            "Rows (items) per decoding round: the batch size.",
            labels,
            buckets=ROWS_BUCKETS,
        )
        self.item_seconds = Histogram(
            "genjob_item_seconds",
            "Seconds from an item's start in the engine to its last token.",
            labels,
            buckets=ITEM_BUCKETS,
        )
        self.rows = Gauge(
            "genjob_rows_in_flight", "Rows (items) decoding now.", labels, multiprocess_mode="livesum"
        )
        self.tokens_per_second = Gauge(
            "genjob_tokens_per_second",
            f"Tokens per second produced over the last {RATE_WINDOW_S:g} s of a chunk's rounds (0 idle).",
            labels,
            multiprocess_mode="livesum",
        )
        self.acceptance = Gauge(
            "genjob_acceptance_rate",
            f"Share of draft tokens the target accepted over the last {RATE_WINDOW_S:g} s of rounds "
            "(the latest value; none for plain decoding).",
            labels,
            multiprocess_mode="livemostrecent",
        )
        self.model_load_seconds = Histogram(
            "genjob_model_load_seconds",
            "Seconds a worker took to make a job's runner: its models and tokenizer (calibration excluded).",
            SETUP_LABELS,
            buckets=SETUP_BUCKETS,
        )
        self.calibration_seconds = Histogram(
            "genjob_calibration_seconds",
            "Seconds a worker spent measuring its forward costs for a job's models (speculation's set-up).",
            SETUP_LABELS,
            buckets=SETUP_BUCKETS,
        )
        self.chunks = Counter(
            "genjob_chunks",
            "Chunks a worker ended, by outcome: clean, with_failures (items failed for good), stopped "
            "(the job ended or the worker stopped), faulted (the worker failed holding it).",
            (*labels, "outcome"),
        )
        # Per pool process (``pid``, dead ones left out): its progress, for /healthz and alerts.
        self.progress_at = Gauge(
            "genjob_worker_progress_timestamp_seconds",
            "Unix time a pool process last made progress: an engine round, or taking its chunk.",
            ("worker",),
            multiprocess_mode="liveall",
        )
        self.holding = Gauge(
            "genjob_worker_holding_chunk",
            "1 while a pool process holds a chunk (its items' leases).",
            ("worker",),
            multiprocess_mode="liveall",
        )
        self.stall_bound = Gauge(
            "genjob_worker_stall_bound_seconds",
            "How long a pool process may go without progress now (GENJOB_ROUND_STALL_S, or "
            "GENJOB_LOAD_STALL_S while it loads models).",
            ("worker",),
            multiprocess_mode="liveall",
        )


_WORKER_METRICS: WorkerMetrics | None = None


def worker_metrics() -> WorkerMetrics:
    global _WORKER_METRICS
    if _WORKER_METRICS is None:
        _WORKER_METRICS = WorkerMetrics()
    return _WORKER_METRICS


def multiprocess_registry() -> CollectorRegistry:
    """A registry adding up every process's files (dead processes' live gauges left out), and the
    build info."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

    directory = os.environ[MULTIPROC_ENV]
    for path in Path(directory).glob("gauge_live*_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        if not _alive(pid):
            mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    registry.register(BuildInfo())
    return registry


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The registry in Prometheus' text format, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry), CONTENT_TYPE_LATEST


class BuildInfo:
    """``genjob_build_info{version="…"} 1``: which genjob serves these metrics."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import InfoMetricFamily

        from genjob import __version__

        yield InfoMetricFamily(
            "genjob_build", "The genjob version serving these metrics.", {"version": __version__}
        )


class StateCollector:
    """Scrape-time gauges from the database and the broker: jobs by status, open items, queue depth.

    ``read`` returns ``{"jobs": {status: n}, "items": {(queue, state): n}, "queues": {queue: n}}``.
    """

    def __init__(self, read: Any) -> None:
        self.read = read

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        state = self.read()
        jobs = GaugeMetricFamily("genjob_jobs", "Jobs by status.", labels=["status"])
        for status, count in sorted(state["jobs"].items()):
            jobs.add_metric([status], count)
        items = GaugeMetricFamily(
            "genjob_open_items",
            "Items of live jobs not yet final, by queue and state.",
            labels=["queue", "state"],
        )
        for (queue, status), count in sorted(state["items"].items()):
            items.add_metric([queue, status], count)
        depth = GaugeMetricFamily(
            "genjob_queue_depth", "Task messages waiting in the broker, by queue.", labels=["queue"]
        )
        for queue, count in sorted(state["queues"].items()):
            depth.add_metric([queue], count)
        yield from (jobs, items, depth)
