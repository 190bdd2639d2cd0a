"""Large job: submit a 100,000-line file and drain it through real Redis, Celery and Postgres.

Only the models are replaced, by a no-op stand-in (tests/doubles/model_doubles.py: each item
"generates" one token instantly), so what is measured is genjob's own cost per item: the claim,
the lease, the result write and the counters, plus Celery's per-chunk messaging.

    .venv/bin/python bench/large_job.py                    # 100,000 lines, 2 workers
    .venv/bin/python bench/large_job.py --lines 5000 --workers 1
    .venv/bin/python bench/large_job.py --lines 2000000 --no-drain [--no-ids]   # store + queue only

Needs Postgres (GENJOB_TEST_PG_ADMIN_URL, default postgres@127.0.0.1:5432) and Redis
(GENJOB_TEST_REDIS_URL, default 127.0.0.1:6379/0), as the tests. It makes its own database and queue
and drops both afterwards. Prints a Markdown report (docs/benchmarks.md keeps the one recorded).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from repo_root import ROOT
from sqlalchemy import create_engine, text

from tests.support.databases import REDIS_URL, broker_marked, pg_database, throwaway_queue
from tests.support.jobs import wait_for_job_end
from tests.support.processes import WorkerProcess, measured_submit, service_env, stop_all
from tests.support.prompts import prompts_file
from tests.support.waiting import wait_for

# A path: the catalog refuses a model it does not know (the stand-in ignores it).
MODEL = ["-m", str(ROOT / "models" / "demo" / "target"), "--mode", "none"]


def write_prompts(path: Path, lines: int, ids: bool = True) -> Path:
    prompts = (
        f"Summarise ticket {i}: the export job stalls at step {i % 97} after a retry." for i in range(lines)
    )
    return prompts_file(path, prompts, id_format="ticket-{:06d}" if ids else None)


def wait_until_ended(url: str, job_id: str) -> tuple[str, int, int]:
    job = wait_for_job_end(url, job_id, timeout=24 * 3600, every=0.5)
    return job.status, job.done, job.failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=16)
    parser.add_argument("--no-drain", action="store_true", help="store and queue only: no workers")
    parser.add_argument("--no-ids", action="store_true", help="lines without custom ids")
    args = parser.parse_args()
    if args.no_drain:
        args.workers = 0

    with pg_database("genjob_bench") as url, throwaway_queue("bench") as queue:
        run(args, url, queue)


def run(args: argparse.Namespace, url: str, queue: str) -> None:
    # the stand-in decodes one item at a time
    env = service_env(url, queue, cost_cache_dir=None, chunk_size=str(args.chunk_size), batch_size="1")
    engine = create_engine(url)
    workers: list[WorkerProcess] = []
    try:
        workers += [WorkerProcess(f"{queue}-{n}", env, quiet=True) for n in range(args.workers)]
        # Steady state first: the workers' sweeper has marked the broker (the first sweep on a
        # fresh broker queues every pending item again, which would add duplicates to the measure).
        if workers:
            wait_for(lambda: broker_marked(REDIS_URL, url), timeout=120, what="a sweeper to mark the broker")
        with tempfile.TemporaryDirectory() as tmp:
            small = write_prompts(Path(tmp) / "small.jsonl", 1000, not args.no_ids)
            large = write_prompts(Path(tmp) / "large.jsonl", args.lines, not args.no_ids)
            size_mb = large.stat().st_size / 1e6
            small_id, small_wall, small_rss = measured_submit(env, small, *MODEL)
            if not args.no_drain:
                wait_until_ended(url, small_id)
            started = time.perf_counter()
            job_id, submit_wall, submit_rss = measured_submit(env, large, *MODEL)
        if args.no_drain:
            with engine.connect() as connection:
                queued = connection.execute(
                    text("SELECT queued_seq, total FROM jobs WHERE id = :id"), {"id": job_id}
                ).one()
            kind = "no ids" if args.no_ids else "with ids"
            print(f"## Large job, stored and queued: {args.lines:,} lines ({kind})")
            print()
            print("| measure | value |")
            print("|---|---|")
            print(f"| file | {args.lines:,} lines, {size_mb:.1f} MB |")
            messages = -(-args.lines // args.chunk_size)
            print(f"| submit wall time (validate, COPY, {messages:,} messages) | {submit_wall:.1f} s |")
            print(f"| submit peak RSS | {submit_rss / 1024:.1f} MiB |")
            print(f"| submit peak RSS, 1,000 lines | {small_rss / 1024:.1f} MiB ({small_wall:.1f} s) |")
            print(f"| queued (jobs.queued_seq / total) | {queued[0]:,} / {queued[1]:,} |")
            return
        status, done, failed = wait_until_ended(url, job_id)
        finished = time.perf_counter()
        with engine.connect() as connection:
            results = connection.execute(
                text("SELECT count(*) FROM results WHERE job_id = :id"), {"id": job_id}
            ).scalar_one()
            drain = connection.execute(
                text("SELECT extract(epoch FROM finished_at - started_at) FROM jobs WHERE id = :id"),
                {"id": job_id},
            ).scalar_one()
    finally:
        engine.dispose()
        stop_all(workers, grace=60)

    drain = float(drain)  # first claim to last result, as the job row records them
    rate = done / drain
    messages = -(-args.lines // args.chunk_size)
    rows = [
        ("file", f"{args.lines:,} lines, {size_mb:.1f} MB"),
        (f"submit wall time (validate, COPY insert, {messages:,} messages)", f"{submit_wall:.1f} s"),
        (f"submit peak RSS, {args.lines:,} lines", f"{submit_rss / 1024:.1f} MiB"),
        ("submit peak RSS, 1,000 lines", f"{small_rss / 1024:.1f} MiB ({small_wall:.1f} s)"),
        ("final state", f"{status}, {done:,} done, {failed} failed, {results:,} result rows"),
        ("drain (first claim → last result)", f"{drain:.1f} s"),
        ("submit start → job completed", f"{finished - started:.1f} s"),
        ("throughput", f"{rate:.0f} items/s"),
        ("overhead per item, per worker process", f"{1000 * args.workers / rate:.1f} ms"),
    ]
    print(
        f"## Large job: {args.lines:,} lines, {args.workers} workers x 1 process, chunks of {args.chunk_size}"
    )
    print()
    print("| measure | value |")
    print("|---|---|")
    for measure, value in rows:
        print(f"| {measure} | {value} |")


if __name__ == "__main__":
    main()
