"""``genjob top``: a live terminal view of the jobs that are running and the workers running them.

Per job, in the order they give way on a narrow terminal: its id, status, done/total, tokens/s and
ETA, then failures, acceptance (α) and measured speedup, then items running, a progress bar, its
name, and last the sparklines of tokens/s, acceptance (from its results, bucketed in the database, so
the recent past shows at once) and speedup (sampled from the job's sums while top runs). Columns are
dropped from the end of that order until the rest fits the terminal. Tokens/s, α and ETA are the
job's recent pace, the one ``genjob wait`` shows (``genjob.cli.pace``), started from its results of
the last ``RATE_WINDOW_S`` seconds. Per worker: online or offline (with a broker, whether it answers
a ping), or stalled (it holds running items whose leases ran out unrenewed: no progress on them),
items running, results in the window, tokens/s over the last ``RATE_WINDOW_S`` seconds, its last
result. With a broker, the messages waiting in each queue. ``--once`` prints one frame and exits.
Must not know: the workers' code, the HTTP API.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import click
from rich.cells import cell_len
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from genjob.cli.context import Duration, settings_and_schema
from genjob.cli.errors import printable
from genjob.cli.pace import RATE_WINDOW_S, Pace, Rate
from genjob.db import session_scope
from genjob.queueing import online_workers, queue_depths
from genjob.settings import Settings
from genjob.stats import measured_speedup
from genjob.store import activity
from genjob.tables import Job, utcnow

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

SPARKS = "▁▂▃▄▅▆▇█"
COLUMNS = 20  # sparkline width: the window in this many buckets
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
    rate: Rate | None  # the recent pace, as `genjob wait` has it; None until it can be told
    tokens_per_s: list[float | None]  # per bucket, oldest first
    acceptance: list[float | None]


@dataclass
class WorkerView:
    activity: activity.WorkerActivity  # results in the window, items running now
    recent_tokens: int  # new tokens of its results in the last RATE_WINDOW_S
    online: bool | None  # answers a ping; None: not known (no broker, or it did not answer us)


@dataclass
class Frame:
    now: datetime
    width: int  # seconds per bucket
    jobs: list[JobView]
    workers: list[WorkerView]
    queues: dict[str, int]


@dataclass
class History:
    """What top keeps between frames: each job's pace, and its measured speedup at every refresh."""

    paces: dict[str, Pace] = field(default_factory=dict)
    speedups: dict[str, deque[float | None]] = field(default_factory=dict)

    def add(self, frame: Frame) -> None:
        for view in frame.jobs:
            self.speedups.setdefault(view.job.id, deque(maxlen=COLUMNS)).append(measured_speedup(view.job))

    def speedup(self, job_id: str) -> list[float | None]:
        return list(self.speedups.get(job_id, ()))


def _epoch(moment: datetime) -> float:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()  # SQLite: naive UTC


def _paces(session: Session, jobs: Sequence[Job], history: History, now: datetime) -> dict[str, Rate | None]:
    """Each job's pace after this frame's sample; a job seen for the first time starts from its
    results of the last RATE_WINDOW_S seconds (or since it started, if later)."""
    new = [job for job in jobs if job.id not in history.paces and job.started_at is not None]
    since = now - timedelta(seconds=RATE_WINDOW_S)
    recent = activity.result_buckets(session, job_ids=[job.id for job in new], since=since, width=1)
    for job in new:
        assert job.started_at is not None
        buckets = recent.get(job.id, [])
        history.paces[job.id] = pace = Pace()
        pace.seed(
            job,
            at=max(_epoch(since), _epoch(job.started_at)),
            items=sum(b.items for b in buckets),
            tokens=sum(b.new_tokens for b in buckets),
            accepted=sum(b.accepted for b in buckets),
            proposed=sum(b.proposed for b in buckets),
        )
    rates: dict[str, Rate | None] = {}
    for job in jobs:
        pace = history.paces.setdefault(job.id, Pace())
        pace.add(job, now.timestamp())
        rates[job.id] = pace.rate(job)
    return rates


def collect(
    settings: Settings, *, window: timedelta, history: History | None = None, now: datetime | None = None
) -> Frame:
    now = now or utcnow()
    history = history if history is not None else History()
    width = max(1, round(window.total_seconds() / COLUMNS))
    first = int(now.timestamp()) // width * width - (COLUMNS - 1) * width
    since = datetime.fromtimestamp(first, tz=now.tzinfo)
    with session_scope(settings.database_url) as session:
        jobs = list(activity.live_jobs(session))
        ids = [job.id for job in jobs]
        buckets = activity.result_buckets(session, job_ids=ids, since=since, width=width)
        running = activity.running_items(session, job_ids=ids)
        workers = activity.worker_activity(session, since=since, now=now)
        recent = activity.worker_activity(session, since=now - timedelta(seconds=RATE_WINDOW_S))
        rates = _paces(session, jobs, history, now)
    views = []
    starts = [first + i * width for i in range(COLUMNS)]
    for job in jobs:
        by_start = {bucket.start: bucket for bucket in buckets.get(job.id, [])}
        series = [by_start.get(start) for start in starts]
        views.append(
            JobView(
                job=job,
                running=running.get(job.id, 0),
                rate=rates[job.id],
                tokens_per_s=[b.new_tokens / width if b else 0.0 for b in series],
                acceptance=[b.accepted / b.proposed if b and b.proposed else None for b in series],
            )
        )
    queues: dict[str, int] = {}
    online: set[str] | None = None
    if settings.broker_url:
        queues = queue_depths(settings.broker_url, {settings.queue, *(job.queue for job in jobs)})
        online = online_workers(settings.broker_url)
    return Frame(now, width, views, _worker_views(workers, recent, online), queues)


def _worker_views(
    workers: Sequence[activity.WorkerActivity],
    recent: Sequence[activity.WorkerActivity],
    online: set[str] | None,
) -> list[WorkerView]:
    """Every worker with results in the window or items running, and every worker that answers a
    ping (an idle one too); each marked online or offline when the broker could be asked."""
    tokens = {worker.worker: worker.new_tokens for worker in recent}
    seen = {worker.worker: worker for worker in workers}
    for name in sorted((online or set()) - set(seen)):
        seen[name] = activity.WorkerActivity(name, 0, 0, None, 0)
    return [
        WorkerView(worker, tokens.get(name, 0), None if online is None else name in online)
        for name, worker in sorted(seen.items())
    ]


@dataclass(frozen=True)
class Column:
    header: str
    priority: int  # 0 stays longest on a narrow terminal
    cells: list[str | Text]

    @property
    def width(self) -> int:
        return max([cell_len(self.header), *(cell_len(str(cell)) for cell in self.cells)])


GAP = 2  # between columns: a space of padding on each side


def fitted(columns: Sequence[Column], width: int) -> list[Column]:
    """The columns, in their order, that fit ``width``: taken by priority until the next does not."""
    kept: set[int] = set()
    used = -GAP
    for index in sorted(range(len(columns)), key=lambda i: columns[i].priority):
        used += columns[index].width + GAP
        if kept and used > width:
            break
        kept.add(index)
    return [column for index, column in enumerate(columns) if index in kept]


def table(columns: Sequence[Column], width: int) -> Table:
    shown = fitted(columns, width)
    grid = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    for column in shown:
        grid.add_column(column.header, no_wrap=True)
    for row in zip(*(column.cells for column in shown), strict=True):
        grid.add_row(*row)
    return grid


def _eta(view: JobView) -> str:
    if not view.job.total - view.job.done - view.job.failed:
        return "-"
    return str(view.rate.eta) if view.rate is not None and view.rate.eta is not None else "?"


def _bar(job: Job, width: int = 10) -> str:
    share = (job.done + job.failed) / job.total if job.total else 0.0
    filled = round(share * width)
    return f"{'█' * filled}{'░' * (width - filled)} {share:4.0%}"


def _job_columns(views: Sequence[JobView], history: History) -> list[Column]:
    def cells(fn: Callable[[JobView], str | Text]) -> list[str | Text]:
        return [fn(view) for view in views]

    def speedup(view: JobView) -> str:
        value = measured_speedup(view.job)
        return f"{value:.2f}x" if value is not None else "-"

    def rate(view: JobView) -> str:
        return f"{view.rate.tokens_per_s:,.1f}" if view.rate is not None else "-"

    def accept(view: JobView) -> str:
        acceptance = view.rate.acceptance if view.rate is not None else None
        return f"{acceptance:.0%}" if acceptance is not None else "-"

    return [
        Column("job", 0, cells(lambda v: v.job.id)),
        Column("name", 10, cells(lambda v: printable(v.job.name or "", keep_newlines=False)[:16])),
        Column("status", 1, cells(lambda v: str(v.job.status))),
        Column("running", 8, cells(lambda v: str(v.running))),
        Column("progress", 9, cells(lambda v: _bar(v.job))),
        Column("done/total", 2, cells(lambda v: f"{v.job.done}/{v.job.total}")),
        Column("failed", 5, cells(lambda v: str(v.job.failed))),
        Column("tok/s", 3, cells(rate)),
        Column("α", 6, cells(accept)),
        Column("speedup", 7, cells(speedup)),
        Column("ETA", 4, cells(_eta)),
        Column("tok/s trend".ljust(COLUMNS), 11, cells(lambda v: Text(sparkline(v.tokens_per_s)))),
        Column("α trend".ljust(COLUMNS), 12, cells(lambda v: Text(sparkline(v.acceptance)))),
        Column("speedup trend", 13, cells(lambda v: Text(sparkline(history.speedup(v.job.id))))),
    ]


def _worker_columns(frame: Frame, views: Sequence[WorkerView]) -> list[Column]:
    def state(view: WorkerView) -> str:
        if view.activity.stalled:  # it answers, or not, but makes no progress on the items it holds
            return "stalled"
        return "-" if view.online is None else "online" if view.online else "offline"

    def last(view: WorkerView) -> str:
        at = view.activity.last_result
        return f"{(frame.now - at).total_seconds():.0f} s ago" if at else "-"

    return [
        Column("worker", 0, [printable(v.activity.worker, keep_newlines=False) for v in views]),
        Column("state", 1, [state(v) for v in views]),
        Column("running", 2, [str(v.activity.running) for v in views]),
        Column("tok/s", 3, [f"{v.recent_tokens / RATE_WINDOW_S:,.1f}" for v in views]),
        Column("items", 4, [str(v.activity.items) for v in views]),
        Column("last result", 5, [last(v) for v in views]),
    ]


def caption(text: str) -> Text:
    """A table's caption on one line of its own, cut with … where the terminal is narrower (a table's
    title would wrap to the table's width)."""
    return Text(text, no_wrap=True, overflow="ellipsis")


def _shown(count: int, room: int) -> int:
    """How many of ``count`` rows to show in ``room`` lines: all, or those leaving a line for "N more"."""
    return count if count <= room else max(1, room - 1)


def render(frame: Frame, history: History, width: int = WIDE_OUTPUT, height: int | None = None) -> Group:
    """The frame as tables that fit ``width`` columns and, where ``height`` is given (a terminal's),
    that many lines: the jobs that do not fit are left out with an ``… N more jobs`` line (the workers
    keep their lines, up to half of the screen, the same way)."""
    window = f"{frame.width * COLUMNS // 60} min"
    title = f"genjob top · {frame.now:%H:%M:%S} UTC · trends: {window}"
    jobs, workers = frame.jobs, frame.workers
    if height is not None:
        worker_room = min(len(workers), max(1, (height - 3) // 2)) + 2 if workers else 0
        workers = workers[: _shown(len(workers), worker_room - 2)] if workers else workers
        jobs = jobs[: _shown(len(jobs), max(1, height - 3 - worker_room))]
    parts: list[Table | Text] = [caption(title)]
    if jobs:
        parts.append(table(_job_columns(jobs, history), width))
        if len(jobs) < len(frame.jobs):
            parts.append(Text(f"… {len(frame.jobs) - len(jobs)} more jobs"))
    else:
        parts.append(Text("(no queued or running jobs)"))
    if workers:
        heading = f"workers · items: results in {window} · tok/s: the last {RATE_WINDOW_S:.0f} s"
        parts.append(caption(heading))
        parts.append(table(_worker_columns(frame, workers), width))
        if len(workers) < len(frame.workers):
            parts.append(Text(f"… {len(frame.workers) - len(workers)} more workers"))
    # The busiest first: a line cut at the terminal's width keeps the queues that hold messages.
    busiest = sorted(frame.queues.items(), key=lambda item: (-item[1], item[0]))
    queues = "  ".join(f"{queue}: {depth} waiting" for queue, depth in busiest)
    parts.append(caption(f"queues: {queues}" if queues else ""))
    return Group(*parts)


def _console_width() -> int | None:
    """``COLUMNS`` from the environment where it is a width, else None."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return None
    return columns if columns > 0 else None


@click.command()
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True, help="Seconds.")
@click.option(
    "--window", type=Duration(), default="5m", show_default=True, help="Span of the sparklines (1m..1h)."
)
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts and logs).")
def top(interval: float, window: timedelta, once: bool) -> None:
    """A live view of running jobs and workers: progress, tokens/s, acceptance, speedup, ETA.

    Tokens/s, α and ETA are the recent pace (the last 30 s), as `genjob wait`
    shows it. The columns that do not fit the terminal are left out, the
    sparklines of the last --window first; jobs that do not fit the
    terminal's height are counted on an "… N more jobs" line. --once prints
    COLUMNS wide where it is set. Workers that do not answer are
    marked offline; those holding items whose leases ran out unrenewed (no
    progress), stalled. Ctrl-C quits.
    """
    from rich.live import Live

    settings = settings_and_schema()
    window = min(max(window, timedelta(minutes=1)), timedelta(hours=1))
    history = History()
    console = Console()
    frame = collect(settings, window=window, history=history)
    history.add(frame)
    if once or not console.is_terminal:
        # COLUMNS where set; else the terminal's width, or, to a log or a pipe, no cropping
        wide = Console(width=_console_width() or (console.width if console.is_terminal else WIDE_OUTPUT))
        wide.print(render(frame, history, wide.width))
        return
    try:
        first = render(frame, history, console.width, console.height)
        with Live(first, console=console, screen=True, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                frame = collect(settings, window=window, history=history)
                history.add(frame)
                live.update(render(frame, history, console.width, console.height), refresh=True)
    except KeyboardInterrupt:
        return


COMMANDS = (top,)
