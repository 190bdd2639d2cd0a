"""Following a job until it ends: the progress bar, the idle-queue warning, and ``genjob wait``.

The bar (stderr, on a terminal only) shows the phase (waiting for a worker; in embedded mode, where
the process that submitted the job runs it, starting in that process and waiting for its submit in
any other; running), items done of the total, failures, tokens/s and acceptance over the last
``RATE_WINDOW_S`` seconds, and the ETA at that pace (``genjob.cli.pace``, which ``genjob top``
shares). With a broker, a job whose queue has messages that no worker has taken for
``GENJOB_QUEUE_IDLE_WARN_S`` gets a warning (once, until something moves); embedded, another
process following a job that has not started says once where it runs (``EMBEDDED_NOTE``). The exit
codes are ``genjob.cli.exits``. Must not know: the workers' code, the HTTP API.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import click

from genjob.cli.context import Duration, job_reference, load_job, settings_and_schema
from genjob.cli.exits import ExitCode, end_line, job_exit_code
from genjob.cli.output import counted
from genjob.cli.pace import Pace
from genjob.constants import TERMINAL_JOB_STATUSES, JobStatus
from genjob.db import session_scope
from genjob.queueing import queue_depths
from genjob.settings import Settings
from genjob.store.activity import running_items
from genjob.tables import Job

POLL_SECONDS = 0.5
EMBEDDED_NOTE = (
    "job {job_id} runs in the process that submitted it (embedded mode: no GENJOB_BROKER_URL, no "
    "workers); if that process has stopped, run the rest with `genjob requeue {job_id}`"
)


@dataclass
class IdleWatch:
    """Warns when a job's queue holds messages and nothing has moved for ``warn_after`` seconds."""

    warn_after: float
    signature: tuple[int, ...] | None = None
    since: float = 0.0
    warned: bool = False

    def check(self, job: Job, running: int, depth: int | None, now: float) -> str | None:
        signature = (job.done, job.failed, running, depth if depth is not None else -1)
        if signature != self.signature:
            self.signature, self.since, self.warned = signature, now, False
            return None
        waiting = running == 0 and (depth > 0 if depth is not None else job.status == JobStatus.QUEUED)
        if not waiting or self.warned or now - self.since < self.warn_after:
            return None
        self.warned = True
        held = f" ({counted(depth, 'chunk')} waiting)" if depth else ""
        return (
            f"warning: no worker has taken anything from queue {job.queue!r} for {now - self.since:.0f} s"
            f"{held}: is one running? genjob worker -Q {job.queue}"
        )


@contextmanager
def phases(show: bool) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr (a terminal, ``show``) naming the submit's phase: validating, storing, queueing."""
    from rich.console import Console

    console = Console(stderr=True)
    if not (show and console.is_terminal):
        yield lambda _phase: None
        return
    with console.status("starting") as status:
        yield lambda phase: status.update(f"{phase}…")


def _phase(job: Job, running: int, *, here: bool, embedded: bool) -> str:
    """The bar's label. ``here``: this process runs the job; ``embedded``: no broker, so the process
    that submitted the job runs it, and no worker will."""
    if not _waiting(job, running):
        return str(job.status)
    if here:
        return "starting"
    return "waiting for its submit" if embedded else "waiting for a worker"


def _waiting(job: Job, running: int) -> bool:
    """Nothing has started: queued, or running with nothing in flight and nothing done yet."""
    if job.status == JobStatus.QUEUED:
        return True
    return job.status == JobStatus.RUNNING and not running and not job.done


def _observe(settings: Settings, job_id: str) -> tuple[Job, int, int | None]:
    job = load_job(settings, job_id)
    with session_scope(settings.database_url) as session:
        running = running_items(session, job_ids=[job.id]).get(job.id, 0)
    depth = None
    if settings.broker_url:
        depth = queue_depths(settings.broker_url, [job.queue]).get(job.queue)
    return job, running, depth


def follow_job(
    settings: Settings,
    job_id: str,
    *,
    worker: threading.Thread | None = None,
    timeout: timedelta | None = None,
    show: bool = True,
) -> Job:
    """Poll the job (a progress bar on a terminal) until it ends, ``worker`` stops, or ``timeout``."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TextColumn("{task.fields[rate]}"),
        TextColumn("{task.fields[accept]}"),
        TextColumn("{task.fields[eta]}"),
    )
    deadline = time.monotonic() + timeout.total_seconds() if timeout is not None else None
    pace, idle = Pace(), IdleWatch(settings.queue_idle_warn_s)
    here, noted = worker is not None, False
    with Progress(*columns, console=console, disable=not (show and console.is_terminal)) as progress:
        task = progress.add_task("", total=None, failed=0, rate="", accept="", eta="")
        while True:
            job, running, depth = _observe(settings, job_id)
            now = time.monotonic()
            pace.add(job, now)
            progress.update(
                task,
                total=job.total,
                completed=job.done + job.failed,
                description=_phase(job, running, here=here, embedded=settings.embedded),
            )
            progress.tasks[task].fields.update(failed=job.failed, **pace.fields(job))
            warning = None
            if not settings.embedded:
                warning = idle.check(job, running, depth, now)
            elif show and not here and not noted and _waiting(job, running):
                warning, noted = EMBEDDED_NOTE.format(job_id=job.id), True
            if warning:
                if progress.live.is_started:
                    progress.console.print(warning)
                else:
                    click.echo(warning, err=True)
            thread_done = worker is not None and not worker.is_alive()
            if (job.status in TERMINAL_JOB_STATUSES and worker is None) or thread_done:
                return job
            if deadline is not None and now >= deadline:
                return job
            time.sleep(POLL_SECONDS)


@click.command()
@job_reference
@click.option("--timeout", type=Duration(), help="Give up after this long (30s, 10m, 2h): exit 5.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar: only the final line.")
@click.pass_context
def wait(ctx: click.Context, job_id: str, timeout: timedelta | None, quiet: bool) -> None:
    """Follow a job until it ends, with a progress bar; its exit code tells how it ended.

    0: every item done; 3: items failed (or the job failed); 4: cancelled or
    expired; 5: --timeout ran out first (the job goes on); 130: Ctrl-C.
    """
    settings = settings_and_schema()
    try:
        job = follow_job(settings, job_id, timeout=timeout, show=not quiet)
    except KeyboardInterrupt:
        click.echo(f"stopped following job {job_id}; it goes on (genjob wait {job_id})", err=True)
        ctx.exit(ExitCode.INTERRUPTED)
    if job.status not in TERMINAL_JOB_STATUSES:
        click.echo(
            f"still {job.status} after {timeout}: {job.done} done, {job.failed} failed of {job.total}",
            err=True,
        )
        ctx.exit(ExitCode.TIMEOUT)
    click.echo(end_line(job), err=True)
    ctx.exit(job_exit_code(job))


COMMANDS = (wait,)
