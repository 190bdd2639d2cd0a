"""``genjob submit``: validate and store a file of prompts as a job, then queue it or, embedded, run it.

With a broker the job's chunks are queued for the workers (``--wait`` follows it to its end); with
none (embedded mode) the job runs in a thread of this process while the main thread follows it,
with a progress bar when stderr is a terminal. Its exit code is the job's (``genjob.cli.exits``)
once it is followed to its end. Must not know: the workers' code, the HTTP API.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from genjob.api.prompt_tokenizer import PromptTokenizer
from genjob.catalog import JobOptionsError, job_spec, parse_job_options
from genjob.cli.context import Duration, load_job, settings_and_schema
from genjob.cli.embedded import EmbeddedRun
from genjob.cli.exits import ExitCode, end_line, job_exit_code
from genjob.cli.follow import follow_job, phases
from genjob.cli.jobs import deadline, enqueue_or_explain
from genjob.cli.options import job_options, option_values
from genjob.formats.lines import InputFileError
from genjob.generation.model_kinds import local_model_refusal
from genjob.store.idempotency import MAX_KEY_CHARS, IdempotencyConflict
from genjob.submit import Submitter, store_job


@click.command()
@click.argument("prompts", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path))
@job_options()
@click.option(
    "--expire-after",
    type=Duration(),
    help="Deadline (30s, 10m, 2h, 1d): the job then ends expired, unstarted items too.",
)
@click.option("--wait", is_flag=True, help="Follow the job with a progress bar until it ends.")
@click.option(
    "--idempotency-key",
    metavar="KEY",
    help="Retry-safe submit: a second submit with this KEY and the same file and options prints the "
    "first one's job (and queues nothing); with other content it is refused. Never a second job.",
)
@click.pass_context
def submit(
    ctx: click.Context,
    prompts: Path,
    wait: bool,
    expire_after: timedelta | None,
    idempotency_key: str | None,
    **values: Any,
) -> None:
    """Submit PROMPTS (JSONL, one {"prompt": ..., "id": ...} per line) as a job.

    The whole file is validated first; a bad line fails the submit with
    FILE:LINE: reason and nothing is stored. Prints the job id. PROMPTS may be
    a pipe, or - for standard input. With --input-format openai, lines are
    OpenAI batch requests ({"custom_id": ..., "body": {"prompt" or "messages": ...}}).
    With --wait (and in embedded mode, which runs the job here, with a
    progress bar on a terminal), the exit code tells how the job ended: 0 all
    done, 3 items failed, 4 cancelled or expired.
    """
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_KEY_CHARS:
        raise click.ClickException(f"--idempotency-key must have 1 to {MAX_KEY_CHARS} characters")
    settings = settings_and_schema()
    try:
        options = parse_job_options(option_values(values))
        spec = job_spec(settings, options, allow_paths=True)
    except JobOptionsError as exc:
        raise click.ClickException(f"invalid job options: {exc}") from exc
    for location in (spec.model, spec.assistant):
        refusal = local_model_refusal(location) if location else None
        if refusal is not None:  # a local model whose config genjob cannot decode: nothing is stored
            raise click.ClickException(refusal)
    try:
        with phases(wait or settings.embedded) as phase:
            submitted = store_job(
                settings,
                path=prompts,
                spec=spec,
                tokenizer=PromptTokenizer(spec.model, cache_dir=settings.model_cache_dir),
                name=options.name,
                expires_at=deadline(expire_after),
                input_format=options.input_format,
                on_phase=phase,
                submitter=Submitter.of(settings, options, spec),
                idempotency_key=idempotency_key,
            )
    except (InputFileError, IdempotencyConflict) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(submitted.job_id)
    chunk_size = settings.option_or_setting("chunk_size", options.chunk_size)
    if submitted.reused:
        click.echo(f"already submitted with this idempotency key: job {submitted.job_id}", err=True)
        if wait:
            follow_job(settings, submitted.job_id)
            job = load_job(settings, submitted.job_id)
            click.echo(end_line(job), err=True)
            ctx.exit(job_exit_code(job))
        return
    if settings.embedded:
        runner = EmbeddedRun(settings, submitted.job_id, chunk_size)
        runner.start()
        runner.follow(show=True)  # a progress bar on a terminal: the job runs here, now
    else:
        with phases(wait) as phase:
            phase("queueing")
            enqueue_or_explain(settings, job_id=submitted.job_id, chunk_size=chunk_size)
        if not wait:
            return
        try:
            follow_job(settings, submitted.job_id)
        except KeyboardInterrupt:
            click.echo(
                f"stopped following job {submitted.job_id}; it goes on: genjob wait {submitted.job_id}",
                err=True,
            )
            ctx.exit(ExitCode.INTERRUPTED)
    job = load_job(settings, submitted.job_id)
    code = job_exit_code(job)
    if wait or code != ExitCode.OK:
        click.echo(end_line(job), err=True)
    ctx.exit(code)


COMMANDS = (submit,)
