"""Large job: submit a 100,000-line file and drain it through real Redis, Celery and Postgres.

Only the models are replaced, by a no-op stand-in (tests/doubles/model_doubles.py: each item
"generates" one token instantly), so what is measured is genjob's own cost per item: the claim,
the lease, the result write and the counters, plus Celery's per-chunk messaging.

    .venv/bin/python bench/large_job.py                    # 100,000 lines, 2 workers
    .venv/bin/python bench/large_job.py --lines 5000 --workers 1
    .venv/bin/python bench/large_job.py --lines 2000000 --no-drain [--no-ids]   # store + queue only

Needs Postgres (GENJOB_BENCH_PG_ADMIN_URL, default postgres@127.0.0.1:5432) and Redis
(GENJOB_BENCH_REDIS_URL, default 127.0.0.1:6379/0). It makes its own database and queue and drops
both afterwards. Prints a Markdown report (docs/benchmarks.md keeps the one recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
from sqlalchemy import create_engine, text

from genjob import db
from genjob.queueing import queue_keys
from genjob.worker.sweeper import broker_mark_key

ROOT = Path(__file__).resolve().parent.parent
GENJOB = str(Path(sys.executable).with_name("genjob"))
DOUBLES = ROOT / "tests" / "doubles"
PG_ADMIN_URL = os.environ.get(
    "GENJOB_BENCH_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("GENJOB_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def write_prompts(path: Path, lines: int, ids: bool = True) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for i in range(lines):
            prompt = f"Summarise ticket {i}: the export job stalls at step {i % 97} after a retry."
            line = {"prompt": prompt, "id": f"ticket-{i:06d}"} if ids else {"prompt": prompt}
            out.write(json.dumps(line) + "\n")
    return path


def env_for(url: str, queue: str, chunk_size: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENJOB_")}
    env.update(
        GENJOB_DATABASE_URL=url,
        GENJOB_BROKER_URL=REDIS_URL,
        GENJOB_QUEUE=queue,
        GENJOB_CHUNK_SIZE=str(chunk_size),
        GENJOB_BATCH_SIZE="1",  # the stand-in decodes one item at a time
        GENJOB_TORCH_THREADS="1",
        PYTHONPATH=str(DOUBLES),
    )
    return env


def timed_submit(env: dict[str, str], path: Path) -> tuple[str, float, int]:
    """(job id, wall seconds, peak RSS KiB) of one `genjob submit` process."""
    started = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-f", "maxrss=%M", GENJOB, "submit", str(path), "-m", "noop", "--mode", "none"],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"genjob submit failed:\n{done.stderr}")
    rss = int(re.search(r"maxrss=(\d+)", done.stderr).group(1))
    return done.stdout.strip(), wall, rss


def job_state(engine, job_id: str) -> tuple[str, int, int]:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT status, done, failed FROM jobs WHERE id = :id"), {"id": job_id}
        ).one()


def wait_until_ended(engine, job_id: str) -> tuple[str, int, int]:
    while True:
        status, done, failed = job_state(engine, job_id)
        if status not in ("queued", "running"):
            return status, done, failed
        time.sleep(0.5)


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

    name = f"genjob_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    db.upgrade(url)
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    env = env_for(url, queue, args.chunk_size)
    engine = create_engine(url)
    broker = redis.Redis.from_url(REDIS_URL)
    workers: list[subprocess.Popen] = []
    try:
        for n in range(args.workers):
            workers.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "scripted_worker",
                        "worker",
                        "-Q",
                        queue,
                        "-c",
                        "1",
                        "-n",
                        f"{queue}-{n}@%h",
                        "-l",
                        "WARNING",
                    ],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        # Steady state first: the workers' sweeper has marked the broker (the first sweep on a
        # fresh broker queues every pending item again, which would add duplicates to the measure).
        deadline = time.monotonic() + 120
        while not broker.exists(broker_mark_key(url)) and time.monotonic() < deadline:
            time.sleep(0.5)
        with tempfile.TemporaryDirectory() as tmp:
            small = write_prompts(Path(tmp) / "small.jsonl", 1000, not args.no_ids)
            large = write_prompts(Path(tmp) / "large.jsonl", args.lines, not args.no_ids)
            size_mb = large.stat().st_size / 1e6
            small_id, small_wall, small_rss = timed_submit(env, small)
            if not args.no_drain:
                wait_until_ended(engine, small_id)
            started = time.perf_counter()
            job_id, submit_wall, submit_rss = timed_submit(env, large)
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
        status, done, failed = wait_until_ended(engine, job_id)
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
        for worker in workers:
            os.killpg(worker.pid, 15)
        for worker in workers:
            worker.wait(timeout=60)
        broker.delete(*queue_keys(queue))
        db.get_engine.cache_clear()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

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
