"""Operator commands: database migrations, the worker process and measuring a worker's forward costs."""

from __future__ import annotations

import os
import time
from typing import Any

import click

from genjob import db
from genjob.catalog import JobOptionsError, job_spec, parse_job_options
from genjob.cli.extras import require_extra
from genjob.cli.options import job_options, option_values
from genjob.settings import get_settings


@click.group("db")
def db_group() -> None:
    """Database schema (Alembic migrations)."""


@db_group.command()
@click.option("--revision", default="head", show_default=True)
def upgrade(revision: str) -> None:
    """Migrate the database (GENJOB_DATABASE_URL) up to REVISION."""
    url = get_settings().database_url
    db.upgrade(url, revision)
    click.echo(f"database at {db.current_revision(url)}")


@db_group.command()
@click.argument("revision")
def downgrade(revision: str) -> None:
    """Migrate the database down to REVISION: a revision id (`genjob db current`), -1 for one step,
    or base, which drops every table and all the jobs in them."""
    url = get_settings().database_url
    db.downgrade(url, revision)
    click.echo(f"database at {db.current_revision(url) or 'base'}")


@db_group.command()
def current() -> None:
    """Print the database's revision and the code's head."""
    url = get_settings().database_url
    click.echo(f"database: {db.current_revision(url) or 'base'}\nhead:     {db.head_revision()}")


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("-Q", "--queue", help="Queue to consume (default: GENJOB_QUEUE).")
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Pool processes; on CUDA one per GPU (cuda:0 … cuda:N-1), at most the GPUs it sees.",
)
@click.option("-n", "--hostname", default="genjob@%h", show_default=True, help="Worker name in Flower.")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="Serve Prometheus metrics on this port (/metrics; default GENJOB_METRICS_PORT, unset: none).",
)
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker(
    queue: str | None,
    concurrency: int,
    hostname: str,
    loglevel: str,
    metrics_port: int | None,
    celery_args: tuple,
) -> None:
    """Run a Celery worker that generates queued chunks.

    Checks its device first (GENJOB_DEVICE), in a short-lived process of its
    own: a device that cannot start or run a warm-up computation stops it before
    it takes any chunk (exit 1, one line saying why). Each pool process uses
    GENJOB_TORCH_THREADS torch threads (default: the cores this worker may use
    ÷ --concurrency). On CUDA (GENJOB_DEVICE cuda, or auto with a GPU) the i-th
    pool process uses cuda:i, and -c above the GPUs it sees is refused; with
    cpu every process uses the CPU. Acks late, prefetches one chunk, loads models once per process. Extra
    arguments go to `celery worker` as they are. With --metrics-port, the
    pool processes' metrics are served from the main process (Prometheus
    multiprocess mode, in PROMETHEUS_MULTIPROC_DIR or a temporary directory).
    """
    require_extra("worker", "worker")  # a base install: one line naming genjob[worker], not a traceback
    settings = get_settings()
    if settings.embedded:
        raise click.ClickException("GENJOB_BROKER_URL is not set: a worker needs a broker (redis://…)")
    # Idle OpenMP threads sleep instead of spinning (before torch loads, here and in the pool children):
    # a spinning pool that shares its cores with anything else (this process, the sweeper, another
    # worker) makes every forward many times slower. OMP_WAIT_POLICY set by the user wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from genjob.worker.device_probe import DeviceUnusable, probe_device
    from genjob.worker.devices import TooManyProcesses, pool_devices

    try:
        probed = probe_device(settings.device)
    except DeviceUnusable as exc:  # a worker that can only fail must not take chunks
        raise click.ClickException(
            f"worker not started: {exc}; set GENJOB_DEVICE to a device this machine has (cpu, cuda:0…)"
        ) from exc
    try:
        devices = pool_devices(settings.device, concurrency, probed.cuda_devices)
    except TooManyProcesses as exc:
        raise click.ClickException(f"worker not started: {exc}") from exc
    click.echo(
        f"device {probed.device}: its warm-up computation ran in a process of its own ({probed.pid})",
        err=True,
    )
    if len(set(devices)) > 1:
        click.echo(f"pool processes' devices: {', '.join(devices)}", err=True)
    port = metrics_port or settings.metrics_port
    if port is not None:
        _serve_metrics(port)
    from genjob.worker.celery_app import create_app
    from genjob.worker.main import run_worker

    run_worker(
        create_app(settings),
        queue=queue or settings.queue,
        concurrency=concurrency,
        hostname=hostname,
        loglevel=loglevel,
        extra=celery_args,
        devices=devices,
    )


def _serve_metrics(port: int) -> None:
    """Multiprocess metrics for this worker's processes, served from here (before anything counts)."""
    import atexit
    import os

    from genjob.telemetry import MULTIPROC_ENV, forget_multiprocess, prepare_multiprocess

    inherited = os.environ.get(MULTIPROC_ENV)
    directory = prepare_multiprocess()
    if not inherited:
        atexit.register(forget_multiprocess, directory)
    from genjob.worker.metrics import serve_metrics

    try:
        serve_metrics(port)
    except OSError as exc:
        raise click.ClickException(f"cannot serve metrics on port {port}: {exc.strerror}") from exc


@click.command()
@job_options()
def calibrate(**values: Any) -> None:
    """Measure this machine's forward costs for a job's models, batch size and draft length, and keep
    them (GENJOB_COST_CACHE_DIR) for the jobs and workers that follow.

    Takes submit's job options. Optional: a job whose worker has nothing kept
    starts from a cheap prior (a few forwards, charged to the job) and learns
    the rest from its own rounds. This thorough grid (several timing passes)
    counts more than a prior; run it with the workers' GENJOB_DEVICE,
    GENJOB_DTYPE and GENJOB_TORCH_THREADS.
    """
    require_extra("worker", "calibrate")
    settings = get_settings()
    try:
        spec = job_spec(settings, parse_job_options(option_values(values)), allow_paths=True)
    except JobOptionsError as exc:
        raise click.ClickException(f"invalid job options: {exc}") from exc
    from genjob.worker.runners import calibrate as measure_costs
    from genjob.worker.runners import set_torch_threads

    set_torch_threads(settings)
    started = time.perf_counter()
    costs, batch, k_max = measure_costs(spec, settings=settings)
    took = time.perf_counter() - started
    line = costs.at_batch(batch, range(k_max + 1))
    verify = ", ".join(f"{int(k) + 1}: {ms:.2f}" for k, ms in line["verify_ms"].items())  # type: ignore[attr-defined]
    click.echo(
        f"batch size {batch}: plain step {line['plain_ms']:.2f} ms, draft step {line['draft_step_ms']:.2f} ms"
    )
    click.echo(f"verification of q tokens per row (ms), q {verify}")
    if not settings.cost_cache_dir:
        kept = "not kept (GENJOB_COST_CACHE_DIR is empty)"
    elif not costs.steady:
        kept = (
            f"kept in {settings.cost_cache_dir}, counting less: the machine was busy (the timing passes "
            "disagreed); run it again when quieter"
        )
    else:
        kept = f"kept in {settings.cost_cache_dir}"
    how = "measured" if costs.measure_seconds else "read"
    click.echo(f"{how} in {took:.1f} s (loading the models included); {kept}")


COMMANDS = (db_group, worker, calibrate)
