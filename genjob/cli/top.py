"""``genjob top``: a live terminal view of the jobs that are running and the workers running them.

Per job: progress, failures, tokens/s and acceptance now (the last minute) and as sparklines over the
window (from its results, bucketed in the database, so the recent past shows at once), the measured
speedup (its sparkline grows while top runs: it is sampled from the job's sums), and the ETA at the
last minute's pace. Per worker: items running, results and tokens/s over the window, its last
result. With a broker, the messages waiting in each queue. ``--once`` prints one frame and exits.
Must not know: the workers' code, the HTTP API.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import click
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from genjob.cli.context import Duration, settings_and_schema
from genjob.cli.errors import printable
from genjob.db import session_scope
from genjob.queueing import queue_depths
from genjob.settings import Settings
from genjob.stats import measured_speedup
from genjob.store import activity
from genjob.tables import Job, utcnow

SPARKS = "▁▂▃▄▅▆▇█"
COLUMNS = 20  # sparkline width: the window in this many buckets
RECENT_S = 60
WIDE_OUTPUT = 240  # columns of a frame printed to a file or pipe


def sparkline(values: Sequence[float | None]) -> str:
    """``▁▃█`` scaled to the largest value; a gap for None."""
    known = [v for v in values if v is not None]
    top = max(known, default=0.0)
    if top <= 0:
        return "".join(" " if v is None else SPARKS[0] for v in values)
    return "".join(" " if v is None else SPARKS[min(int(v / top * (len(SPARKS) - 1)), 7)] for v in values)


@dataclass
class JobView:
    job: Job
    running: int
    tokens_per_s: list[float | None]  # per bucket, oldest first
    acceptance: list[float | None]
    recent_items: int  # results in the last RECENT_S
    recent_tokens: int
    recent_accepted: int
    recent_proposed: int


@dataclass
class Frame:
    now: datetime
    width: int  # seconds per bucket
    jobs: list[JobView]
    workers: list[activity.WorkerActivity]
    queues: dict[str, int]


def collect(settings: Settings, *, window: timedelta, now: datetime | None = None) -> Frame:
    now = now or utcnow()
    width = max(1, round(window.total_seconds() / COLUMNS))
    first = int(now.timestamp()) // width * width - (COLUMNS - 1) * width
    since = datetime.fromtimestamp(first, tz=now.tzinfo)
    with session_scope(settings.database_url) as session:
        jobs = list(activity.live_jobs(session))
        ids = [job.id for job in jobs]
        buckets = activity.result_buckets(session, job_ids=ids, since=since, width=width)
        running = activity.running_items(session, job_ids=ids)
        workers = activity.worker_activity(session, since=since)
    views = []
    recent_from = now.timestamp() - RECENT_S
    for job in jobs:
        by_start = {bucket.start: bucket for bucket in buckets.get(job.id, [])}
        starts = [first + i * width for i in range(COLUMNS)]
        series = [by_start.get(start) for start in starts]
        recent = [b for b in buckets.get(job.id, []) if b.start + width > recent_from]
        views.append(
            JobView(
                job=job,
                running=running.get(job.id, 0),
                tokens_per_s=[b.new_tokens / width if b else 0.0 for b in series],
                acceptance=[b.accepted / b.proposed if b and b.proposed else None for b in series],
                recent_items=sum(b.items for b in recent),
                recent_tokens=sum(b.new_tokens for b in recent),
                recent_accepted=sum(b.accepted for b in recent),
                recent_proposed=sum(b.proposed for b in recent),
            )
        )
    queues: dict[str, int] = {}
    if settings.broker_url:
        queues = queue_depths(settings.broker_url, {settings.queue, *(job.queue for job in jobs)})
    return Frame(now, width, views, workers, queues)


@dataclass
class SpeedupHistory:
    """The measured speedup of each job, sampled at every refresh (the last COLUMNS samples)."""

    samples: dict[str, deque[float | None]] = field(default_factory=dict)

    def add(self, frame: Frame) -> None:
        for view in frame.jobs:
            self.samples.setdefault(view.job.id, deque(maxlen=COLUMNS)).append(measured_speedup(view.job))

    def of(self, job_id: str) -> list[float | None]:
        return list(self.samples.get(job_id, ()))


def _eta(view: JobView) -> str:
    left = view.job.total - view.job.done - view.job.failed
    if not left:
        return "-"
    if not view.recent_items:
        return "?"
    return str(timedelta(seconds=round(left / (view.recent_items / RECENT_S))))


def _progress(job: Job, width: int = 10) -> str:
    finished = job.done + job.failed
    share = finished / job.total if job.total else 0.0
    filled = round(share * width)
    return f"{'█' * filled}{'░' * (width - filled)} {share:4.0%} {finished}/{job.total}"


def render(frame: Frame, history: SpeedupHistory) -> Group:
    jobs = Table(
        title=f"genjob top · {frame.now:%H:%M:%S} UTC · sparklines: {frame.width * COLUMNS // 60} min"
    )
    for name in ("job", "status", "progress", "failed", "tok/s", "α", "speedup", "ETA"):
        jobs.add_column(name, no_wrap=True)
    for name in ("tok/s trend", "α trend", "speedup trend"):
        jobs.add_column(name, no_wrap=True, width=COLUMNS)
    for view in frame.jobs:
        job = view.job
        label = job.id + (f" {printable(job.name, keep_newlines=False)[:16]}" if job.name else "")
        speedup = measured_speedup(job)
        accept = f"{view.recent_accepted / view.recent_proposed:.0%}" if view.recent_proposed else "-"
        jobs.add_row(
            label,
            f"{job.status} ({view.running} running)" if view.running else str(job.status),
            _progress(job),
            str(job.failed),
            f"{view.recent_tokens / RECENT_S:,.1f}",
            accept,
            f"{speedup:.2f}x" if speedup is not None else "-",
            _eta(view),
            Text(sparkline(view.tokens_per_s)),
            Text(sparkline(view.acceptance)),
            Text(sparkline(history.of(job.id))),
        )
    if not frame.jobs:
        jobs.add_row("(no queued or running jobs)", *[""] * 10)
    workers = Table(title="workers (results in the window; running now)")
    for name in ("worker", "running", "items", "tok/s", "last result"):
        workers.add_column(name, no_wrap=True)
    window_s = frame.width * COLUMNS
    for worker in frame.workers:
        age = f"{(frame.now - worker.last_result).total_seconds():.0f} s ago" if worker.last_result else "-"
        workers.add_row(
            printable(worker.worker, keep_newlines=False),
            str(worker.running),
            str(worker.items),
            f"{worker.new_tokens / window_s:,.1f}",
            age,
        )
    queues = "  ".join(f"{queue}: {depth} waiting" for queue, depth in sorted(frame.queues.items()))
    return Group(jobs, workers, Text(f"queues: {queues}" if queues else ""))


@click.command()
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True, help="Seconds.")
@click.option(
    "--window", type=Duration(), default="5m", show_default=True, help="Span of the sparklines (1m..1h)."
)
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts and logs).")
def top(interval: float, window: timedelta, once: bool) -> None:
    """A live view of running jobs and workers: progress, tokens/s, acceptance, speedup, ETA.

    Sparklines show the last --window. Ctrl-C quits.
    """
    from rich.live import Live

    settings = settings_and_schema()
    window = min(max(window, timedelta(minutes=1)), timedelta(hours=1))
    history = SpeedupHistory()
    console = Console()
    frame = collect(settings, window=window)
    history.add(frame)
    if once or not console.is_terminal:
        wide = console if console.is_terminal else Console(width=WIDE_OUTPUT)  # a log or a pipe: no cropping
        wide.print(render(frame, history))
        return
    try:
        with Live(render(frame, history), console=console, screen=True, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                frame = collect(settings, window=window)
                history.add(frame)
                live.update(render(frame, history), refresh=True)
    except KeyboardInterrupt:
        return


COMMANDS = (top,)
