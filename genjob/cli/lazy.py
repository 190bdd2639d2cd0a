"""The ``genjob`` group's commands, imported only when one runs: ``genjob --help`` imports none of them.

A command's module (and whatever it needs: SQLAlchemy, Celery, pydantic, rich) loads when that
command is run or asked for its own ``--help``. The group's help lists every command from
``COMMANDS``: its module, its function, and the first sentence of its docstring (the help shown in
the list, kept equal to the docstring by a test). Must not know: what the commands do.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class LazyCommand:
    module: str  # genjob.cli.<module>
    attribute: str
    summary: str  # the first sentence of its help, as `genjob --help` lists it


COMMANDS: dict[str, LazyCommand] = {
    "api": LazyCommand("serve", "api", "Serve the HTTP API (FastAPI on Granian): POST /v1/jobs and friends."),
    "calibrate": LazyCommand(
        "admin",
        "calibrate",
        "Measure this machine's forward costs for a job's models, batch size and draft length, and keep "
        "them (GENJOB_COST_CACHE_DIR) for the jobs and workers that follow.",
    ),
    "cancel": LazyCommand("jobs", "cancel", "Cancel a job: nothing new starts, what finished is kept."),
    "db": LazyCommand("admin", "db_group", "Database schema (Alembic migrations)."),
    "delete": LazyCommand("housekeeping", "delete", "Delete a job with its items, results and attempts."),
    "flower": LazyCommand(
        "serve", "flower", "Run Flower, the Celery dashboard, on the broker the workers use."
    ),
    "jobs": LazyCommand("jobs", "list_jobs", "List jobs, newest first."),
    "purge": LazyCommand(
        "housekeeping", "purge", "Delete every job that ended longer ago than --older-than, in batches."
    ),
    "requeue": LazyCommand(
        "jobs", "requeue", "Queue what a job is missing (after the broker was down, say)."
    ),
    "results": LazyCommand(
        "results",
        "results",
        "Export a job's results in input order (one record per item, with its custom id).",
    ),
    "retry": LazyCommand("jobs", "retry", "Run a job's failed items again; done items keep their results."),
    "stats": LazyCommand(
        "jobs", "stats", "Show a job's acceptance rate, wall-clock and decode tokens/s, and speedup."
    ),
    "status": LazyCommand("jobs", "status", "Show a job's state, item counts and timestamps."),
    "submit": LazyCommand(
        "submit", "submit", 'Submit PROMPTS (JSONL, one {"prompt": ..., "id": ...} per line) as a job.'
    ),
    "top": LazyCommand(
        "top", "top", "A live view of running jobs and workers: progress, tokens/s, acceptance, speedup, ETA."
    ),
    "wait": LazyCommand(
        "follow", "wait", "Follow a job until it ends, with a progress bar; its exit code tells how it ended."
    ),
    "worker": LazyCommand("admin", "worker", "Run a Celery worker that generates queued chunks."),
}


def load_command(name: str) -> click.Command:
    """The command ``name``, its module imported now."""
    entry = COMMANDS[name]
    command = getattr(importlib.import_module(f"genjob.cli.{entry.module}"), entry.attribute)
    assert isinstance(command, click.Command)
    return command


class LazyGroup(click.Group):
    """A group whose commands are ``COMMANDS``, each imported when it is looked up to run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.add_command(load_command(cmd_name), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands with the first sentence of their help, as click lists them, none imported."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            command = self.commands.get(name) or click.Command(name, help=COMMANDS[name].summary)
            rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)
