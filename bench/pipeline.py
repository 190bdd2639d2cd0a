"""Pipeline: how many items/s genjob's own bookkeeping lets through, on real Redis, Celery and Postgres.

Two worker processes (``genjob worker -c 1`` each) drain one job whose generation costs (next to)
nothing, so what is measured is the claim, the leases, the result and attempt writes, the counters and
Celery's messaging: with the no-op stand-in (``--runner noop``: tests/doubles/model_doubles.py, an item
"generates" one token instantly) or with 1-token generations of the demo target (``--runner demo``:
``--mode none --max-new-tokens 1``). The workers count their database round trips (every statement,
BEGIN, COMMIT and pool pre-ping: bench/counting_worker.py).

    .venv/bin/python bench/pipeline.py --runner noop --items 20000
    .venv/bin/python bench/pipeline.py --runner demo --items 20000

Needs Postgres (GENJOB_BENCH_PG_ADMIN_URL, default postgres@127.0.0.1:5432) and Redis
(GENJOB_BENCH_REDIS_URL, default 127.0.0.1:6379/0); makes its own database and queue and drops both.
Prints a Markdown report (docs/benchmarks.md keeps the one recorded).
"""

from __future__ import annotations

import argparse
import json
import os
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
DEMO_TARGET = ROOT / "models" / "demo" / "target"


def write_prompts(path: Path, lines: int) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for i in range(lines):
            out.write(json.dumps({"prompt": f"def handler_{i}(request):"}) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runner", choices=["noop", "demo"], default="noop")
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--profile", type=Path, help="cProfile each worker's pool process into this folder")
    args = parser.parse_args()

    name = f"genjob_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    db.upgrade(url)
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    counts_dir = Path(tempfile.mkdtemp(prefix="genjob-counts-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENJOB_")}
    env.update(
        GENJOB_DATABASE_URL=url,
        GENJOB_BROKER_URL=REDIS_URL,
        GENJOB_QUEUE=queue,
        GENJOB_CHUNK_SIZE=str(args.chunk_size),
        GENJOB_BATCH_SIZE=str(args.batch_size),
        GENJOB_TORCH_THREADS="1",
        GENJOB_BENCH_COUNT_DIR=str(counts_dir),
        PYTHONPATH=str(DOUBLES),
    )
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        env["GENJOB_BENCH_PROFILE_DIR"] = str(args.profile.resolve())
    worker_argv = [sys.executable, str(ROOT / "bench" / "counting_worker.py")]
    if args.runner == "noop":
        worker_argv.append("--noop")
        model = ["-m", "noop", "--mode", "none"]
    else:
        model = ["-m", str(DEMO_TARGET), "--mode", "none", "--max-new-tokens", "1"]
    engine = create_engine(url)
    broker = redis.Redis.from_url(REDIS_URL)
    workers: list[subprocess.Popen] = []
    try:
        for n in range(args.workers):
            argv = [*worker_argv, "worker", "-Q", queue, "-c", "1", "-n", f"{queue}-{n}@%h", "-l", "WARNING"]
            workers.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + 120
        while not broker.exists(broker_mark_key(url)) and time.monotonic() < deadline:
            time.sleep(0.5)
        with tempfile.TemporaryDirectory() as tmp:
            # a warm-up job: the workers load their models and connect before the measure
            warm = write_prompts(Path(tmp) / "warm.jsonl", 4 * args.workers)
            subprocess.run(
                [GENJOB, "submit", str(warm), *model, "--chunk-size", "1", "--wait"], env=env, check=False
            )
            for stale in [*counts_dir.glob("*.json"), *counts_dir.glob("*.tasks")]:
                stale.unlink()
            path = write_prompts(Path(tmp) / "p.jsonl", args.items)
            done = subprocess.run(
                [GENJOB, "submit", str(path), *model], env=env, capture_output=True, text=True, check=True
            )
            job_id = done.stdout.strip()
        while True:
            with engine.connect() as connection:
                status = connection.execute(
                    text("SELECT status FROM jobs WHERE id = :id"), {"id": job_id}
                ).scalar()
            if status not in ("queued", "running"):
                break
            time.sleep(0.5)
        time.sleep(1)  # the last task's counts
        with engine.connect() as connection:
            row = connection.execute(
                text(
                    "SELECT status, done, failed, extract(epoch FROM finished_at - started_at), "
                    "decode_seconds + prefill_seconds FROM jobs WHERE id = :id"
                ),
                {"id": job_id},
            ).one()
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

    status, done, failed, drain, decode = row
    drain, decode = float(drain), float(decode or 0.0)
    counts: dict[str, int] = {}
    for dump in counts_dir.glob("*.json"):
        for key, value in json.loads(dump.read_text()).items():
            counts[key] = counts.get(key, 0) + value
    trips = sum(counts.values())
    in_tasks = sum(json.loads(dump.read_text())["in_tasks"] for dump in counts_dir.glob("*.tasks"))
    rate = done / drain
    bookkeeping = (args.workers * drain - decode) / done
    print(
        f"## Pipeline: {args.items:,} items, {args.runner} runner, {args.workers} workers x 1 process, "
        f"chunks of {args.chunk_size}, batch {args.batch_size}"
    )
    print()
    print("| measure | value |")
    print("|---|---|")
    for measure, value in (
        ("final state", f"{status}, {done:,} done, {failed} failed"),
        ("drain (first claim → last result)", f"{drain:.1f} s"),
        ("throughput", f"{rate:,.0f} items/s"),
        ("engine time (prefill + decode), all workers", f"{decode:.1f} s"),
        ("bookkeeping per item, per worker process", f"{1000 * bookkeeping:.2f} ms"),
        ("worker processes' time inside tasks / drain", f"{in_tasks / (args.workers * drain):.0%}"),
        ("database round trips per item", f"{trips / done:.3f}"),
        (
            "… of which statements / BEGIN / COMMIT / pre-ping",
            " / ".join(
                f"{counts.get(key, 0) / done:.3f}" for key in ("statements", "begin", "commit", "pre_ping")
            ),
        ),
    ):
        print(f"| {measure} | {value} |")


if __name__ == "__main__":
    main()
