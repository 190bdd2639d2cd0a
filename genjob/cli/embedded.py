"""Embedded mode (no broker): a submitted job's chunks run in a thread of the CLI's own process.

The main thread follows the job (``genjob.cli.follow``) while the thread runs it. Ctrl-C stops the
process at once and cleanly: the leases this process holds are given up in the database, so the
items in flight go back to the job (their try counted as lost) and ``genjob requeue JOB`` resumes
it, as the message says; then the process exits 130 without waiting for the model's computation to
unwind (a thread inside torch cannot be interrupted, and leaving the interpreter under it aborts).
Must not know: the HTTP API.
"""

from __future__ import annotations

import os
import sys
import threading

import click

from genjob.cli.exits import ExitCode
from genjob.cli.follow import follow_job
from genjob.cli.output import counted
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.store import leases
from genjob.tables import Job
from genjob.worker.enqueue import enqueue_job
from genjob.worker.leasing import lease_holder, worker_name


class EmbeddedRun(threading.Thread):
    """Run the job's chunks in this process (a daemon thread), see the module's doc."""

    def __init__(self, settings: Settings, job_id: str, chunk_size: int) -> None:
        super().__init__(name=f"genjob-{job_id}", daemon=True)
        self.settings, self.job_id, self.chunk_size = settings, job_id, chunk_size
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            enqueue_job(self.settings, job_id=self.job_id, chunk_size=self.chunk_size)
        except BaseException as exc:
            self.error = exc

    def follow(self, *, show: bool) -> Job:
        """Follow the job until the thread is done (a progress bar if ``show``); Ctrl-C: ``interrupt``."""
        try:
            job = follow_job(self.settings, self.job_id, worker=self, show=show)
            self.join()
        except KeyboardInterrupt:
            self.interrupt()
        if self.error is not None:
            raise click.ClickException(f"job {self.job_id} crashed: {self.error}")
        return job

    def interrupt(self) -> None:
        """Give the items in flight back to the job, say how to resume it, and exit 130 at once."""
        with session_scope(self.settings.database_url) as session:
            released = leases.give_up_leases(session, worker=lease_holder(worker_name()))
            job = session.get(Job, self.job_id)
        status = f"{job.done} of {job.total} done" if job is not None else "gone"
        given_back = f"{counted(released, 'item')} in flight given back"
        click.echo(
            f"interrupted: job {self.job_id} stopped ({status}; {given_back}); "
            f"resume it with `genjob requeue {self.job_id}`, or drop it with `genjob cancel {self.job_id}`",
            err=True,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ExitCode.INTERRUPTED)
