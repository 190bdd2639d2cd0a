"""Chaos: jobs through real Redis, Celery and Postgres while faults land every second or two.

Workers (the no-op stand-in for the models: tests/doubles/model_doubles.py) drain several jobs while
this loop, again and again, SIGKILLs a whole worker (and starts another) or its pool process,
restarts Redis (its own redis-server, no persistence: the queues are lost), cuts every Postgres
connection of the database (``pg_terminate_backend``: what a Postgres restart does to the clients;
the server itself is shared and stays up), kills a ``genjob submit`` while it stores or queues, and
stalls a worker (SIGSTOP) past its lease. At the end: every job ended, no item lost, no result
twice, every attempt closed and each done item has exactly one ``done`` attempt.

    .venv/bin/python bench/chaos.py --items 100000 --faults 50

Needs Postgres (GENJOB_TEST_PG_ADMIN_URL, as the tests) and redis-server on the PATH. Prints a Markdown
report.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from repo_root import ROOT
from sqlalchemy import create_engine, text

from tests.support.databases import PG_ADMIN_URL, broker_marked, pg_database
from tests.support.processes import GENJOB, RedisServer, WorkerProcess, service_env
from tests.support.prompts import prompts_file
from tests.support.waiting import wait_for

LEASE_S = 5


def write_prompts(path: Path, lines: int, tag: str) -> Path:
    return prompts_file(path, (f"{tag} item {i}" for i in range(lines)), id_format=f"{tag}-{{}}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--faults", type=int, default=50, help="at least this many faults")
    parser.add_argument("--every", type=float, default=1.5, help="seconds between faults")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    with pg_database("genjob_chaos") as url:
        run(args, url, rng)


def run(args: argparse.Namespace, url: str, rng: random.Random) -> None:
    name = url.rsplit("/", 1)[1]
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    tmp = Path(tempfile.mkdtemp(prefix="genjob-chaos-"))
    broker = RedisServer(tmp)
    broker.start()
    queue = f"chaos-{uuid.uuid4().hex[:6]}"
    env = service_env(
        f"{url}?application_name={name}",
        queue,
        broker_url=broker.url,
        cost_cache_dir=None,
        lease_s=str(LEASE_S),
        sweep_interval_s="1",
        retry_backoff_s="0.1",
        max_attempts="10",
        batch_size="16",
        chunk_size="64",
    )
    engine = create_engine(url, pool_pre_ping=True)

    def start_worker(label: str) -> WorkerProcess:
        return WorkerProcess(label, env, tmp / f"{label}.log", quiet=True)

    workers = [start_worker(f"w{n}") for n in range(args.workers)]
    started = time.monotonic()
    faults: Counter[str] = Counter()
    submits: list[subprocess.Popen] = []
    per_job = args.items // args.jobs
    files = [write_prompts(tmp / f"job{n}.jsonl", per_job, f"j{n}") for n in range(args.jobs)]
    stopped: list[tuple[WorkerProcess, float]] = []
    partly_queued: list[int] = []  # items a killed submit had not queued yet, per such job

    def submit(path: Path, *extra: str) -> subprocess.Popen:
        model = str(ROOT / "models" / "demo" / "target")  # a path: the catalog refuses an unknown name
        argv = [GENJOB, "submit", str(path), "-m", model, "--mode", "none", "--chunk-size", "8", *extra]
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def live_jobs() -> int:
        with engine.connect() as connection:
            return connection.execute(
                text("SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')")
            ).scalar()

    try:
        wait_for(lambda: broker_marked(broker.url, url), timeout=120, what="a sweeper to mark the broker")
        pending_files = list(files)
        next_fault = time.monotonic() + args.every
        while True:
            now = time.monotonic()
            for worker, until in list(stopped):
                if now >= until:
                    worker.signal(signal.SIGCONT)
                    stopped.remove((worker, until))
            if pending_files and (not submits or submits[-1].poll() is not None):
                submits.append(submit(pending_files.pop(0)))
            if now >= next_fault and sum(faults.values()) < args.faults:
                next_fault = now + args.every
                kind = rng.choice(
                    [
                        "kill-pool-child",
                        "kill-worker",
                        "restart-redis",
                        "cut-postgres",
                        "kill-submit",
                        "stall-worker",
                    ]
                )
                if kind == "kill-pool-child":
                    pids = [pid for w in workers for pid in w.children()]
                    if pids:
                        os.kill(rng.choice(pids), signal.SIGKILL)
                elif kind == "kill-worker":
                    victim = rng.randrange(len(workers))
                    workers[victim].signal(signal.SIGKILL)
                    workers[victim] = start_worker(f"w{victim}-{faults[kind]}")
                elif kind == "restart-redis":
                    broker.stop()
                    time.sleep(0.5)
                    broker.start()
                elif kind == "cut-postgres":
                    with admin.connect() as connection:
                        connection.execute(
                            text(
                                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :db"
                            ),
                            {"db": name},
                        )
                elif kind == "kill-submit":  # once its job is stored, while it queues the chunks
                    tag = f"x{faults[kind]}"
                    victim_submit = submit(write_prompts(tmp / f"{tag}.jsonl", 2000, tag), "--name", tag)
                    for _ in range(300):
                        with engine.connect() as connection:
                            stored = connection.execute(
                                text("SELECT count(*) FROM jobs WHERE name = :tag"), {"tag": tag}
                            ).scalar()
                        if stored or victim_submit.poll() is not None:
                            break
                        time.sleep(0.05)
                    time.sleep(rng.uniform(0, 0.3))
                    victim_submit.kill()
                    victim_submit.wait()
                    with engine.connect() as connection:
                        left = connection.execute(
                            text("SELECT total - queued_seq FROM jobs WHERE name = :tag"), {"tag": tag}
                        ).scalar()
                    if left:
                        partly_queued.append(int(left))
                elif kind == "stall-worker":
                    worker = rng.choice([w for w in workers if all(w is not s for s, _ in stopped)])
                    worker.signal(signal.SIGSTOP)
                    stopped.append((worker, time.monotonic() + LEASE_S + 3))
                faults[kind] += 1
            quiet = not pending_files and not stopped and all(s.poll() is not None for s in submits)
            if sum(faults.values()) >= args.faults and quiet and live_jobs() == 0:
                break
            if time.monotonic() - started > 3600:
                raise SystemExit("chaos: jobs still live after an hour")
            time.sleep(0.2)
        elapsed = time.monotonic() - started
        with engine.connect() as connection:

            def one(sql: str) -> int:
                return int(connection.execute(text(sql)).scalar() or 0)

            report = {
                "jobs": one("SELECT count(*) FROM jobs"),
                "jobs stored by a killed submit, partly queued": len(partly_queued),
                "… items they had not queued": sum(partly_queued),
                "jobs live at the end": one("SELECT count(*) FROM jobs WHERE status IN ('queued','running')"),
                "items": one("SELECT count(*) FROM items"),
                "items done": one("SELECT count(*) FROM items WHERE status = 'done'"),
                "items failed": one("SELECT count(*) FROM items WHERE status = 'failed'"),
                "items lost (open at the end)": one(
                    "SELECT count(*) FROM items WHERE status IN ('pending','running')"
                ),
                "results": one("SELECT count(*) FROM results"),
                "items with more than one result": one(
                    "SELECT count(*) FROM (SELECT item_id FROM results GROUP BY item_id "
                    "HAVING count(*) > 1) d"
                ),
                "done items without exactly one done attempt": one(
                    "SELECT count(*) FROM items i WHERE i.status = 'done' AND "
                    "(SELECT count(*) FROM attempts a WHERE a.item_id = i.id AND a.outcome = 'done') <> 1"
                ),
                "attempts left open": one("SELECT count(*) FROM attempts WHERE finished_at IS NULL"),
                "job counters off": one(
                    "SELECT count(*) FROM jobs j WHERE j.done <> (SELECT count(*) FROM items i "
                    "WHERE i.job_id = j.id AND i.status = 'done')"
                ),
            }
            outcomes = dict(
                connection.execute(text("SELECT outcome, count(*) FROM attempts GROUP BY outcome")).all()
            )
    finally:
        for worker in workers:
            worker.signal(signal.SIGCONT)
            worker.signal(signal.SIGKILL)
        engine.dispose()
        broker.stop()
        admin.dispose()
    total = sum(faults.values())
    jobs = f"{args.jobs} jobs of {per_job:,} items"
    print(f"## Chaos: {jobs}, {args.workers} workers, {total} faults in {elapsed:.0f} s")
    print()
    print("faults: " + ", ".join(f"{kind} {count}" for kind, count in sorted(faults.items())))
    print()
    print("| check | value |")
    print("|---|---|")
    for check, value in report.items():
        print(f"| {check} | {value:,} |")
    print(f"| attempts by outcome | {', '.join(f'{k} {v:,}' for k, v in sorted(outcomes.items()))} |")


if __name__ == "__main__":
    main()
