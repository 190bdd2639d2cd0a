"""Exit codes: what a script can tell from ``genjob submit --wait``, ``genjob wait`` and an embedded submit.

Distinct from click's own (1: an error, with its message; 2: a usage error):

====  ==========================================================================
0     the job completed and every item is done
3     the job ended with failed items (completed with some, or failed: all, or the job itself)
4     the job was cancelled or expired (its done items are kept)
5     ``genjob wait --timeout`` ran out; the job goes on
130   interrupted (Ctrl-C)
141   its output was closed early (``genjob results JOB | head -1``): it stops quietly, as ``yes | head``
====  ==========================================================================
Must not know: the database, the workers.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

from genjob.constants import JobStatus

if TYPE_CHECKING:
    from genjob.tables import Job


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1  # click.ClickException
    USAGE = 2  # click.UsageError
    ITEMS_FAILED = 3
    STOPPED = 4
    TIMEOUT = 5
    INTERRUPTED = 130
    CLOSED_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away


def job_exit_code(job: Job) -> ExitCode:
    """The exit code of a job that ended (see the module's table)."""
    if job.status in (JobStatus.CANCELLED, JobStatus.EXPIRED):
        return ExitCode.STOPPED
    if job.status == JobStatus.FAILED or job.failed:
        return ExitCode.ITEMS_FAILED
    return ExitCode.OK


def end_line(job: Job) -> str:
    """The one line a follower prints when the job ends: ``completed: 3 done, 0 failed of 3``."""
    line = f"{job.status}: {job.done} done, {job.failed} failed of {job.total}"
    return line + (f" ({job.error})" if job.error else "")
