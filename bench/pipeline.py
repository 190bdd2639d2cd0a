"""Pipeline: how many items/s genjob's own bookkeeping lets through, on real Redis, Celery and Postgres.

Two worker processes (``genjob worker -c 1`` each) drain one job whose generation costs (next to)
nothing, so what is measured is the claim, the leases, the result and attempt writes, the counters and
Celery's messaging: with the no-op stand-in (``--runner noop``: tests/doubles/model_doubles.py, an item
"generates" one token instantly) or with 1-token generations of the demo target (``--runner demo``:
``--mode none --max-new-tokens 1``). The workers count their database round trips (every statement,
BEGIN, COMMIT and pool pre-ping: bench/counting_worker.py).

    .venv/bin/python bench/pipeline.py --runner noop --items 20000
    .venv/bin/python bench/pipeline.py --runner demo --items 20000

Needs Postgres (GENJOB_TEST_PG_ADMIN_URL, default postgres@127.0.0.1:5432) and Redis
(GENJOB_TEST_REDIS_URL, default 127.0.0.1:6379/0), as the tests; makes its own database and queue and
drops both.
Prints a Markdown report (docs/benchmarks.md keeps the one recorded).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from repo_root import ROOT
from sqlalchemy import create_engine, text

from tests.support.databases import REDIS_URL, broker_marked, pg_database, throwaway_queue
from tests.support.jobs import wait_for_job_end
from tests.support.processes import WorkerProcess, run_cli, service_env, stop_all
from tests.support.prompts import prompts_file
from tests.support.waiting import wait_for

DEMO_TARGET = ROOT / "models" / "demo" / "target"


def write_prompts(path: Path, lines: int) -> Path:
    return prompts_file(path, (f"def handler_{i}(request):" for i in range(lines)), id_format=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runner", choices=["noop", "demo"], default="noop")
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--profile", type=Path, help="cProfile each worker's pool process into this folder")
    args = parser.parse_args()

    with pg_database("genjob_bench") as url, throwaway_queue("bench") as queue:
        run(args, url, queue)


def run(args: argparse.Namespace, url: str, queue: str) -> None:
    counts_dir = Path(tempfile.mkdtemp(prefix="genjob-counts-"))
    env = service_env(
        url, queue, cost_cache_dir=None, chunk_size=str(args.chunk_size), batch_size=str(args.batch_size)
    )
    env["GENJOB_BENCH_COUNT_DIR"] = str(counts_dir)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        env["GENJOB_BENCH_PROFILE_DIR"] = str(args.profile.resolve())
    genjob = [sys.executable, str(ROOT / "bench" / "counting_worker.py")]
    # a path: the catalog refuses a model it does not know (the no-op stand-in ignores it)
    model = ["-m", str(DEMO_TARGET), "--mode", "none"]
    if args.runner == "noop":
        genjob.append("--noop")
    else:
        model += ["--max-new-tokens", "1"]
    engine = create_engine(url)
    workers: list[WorkerProcess] = []
    try:
        workers += [
            WorkerProcess(f"{queue}-{n}", env, genjob=genjob, quiet=True) for n in range(args.workers)
        ]
        wait_for(lambda: broker_marked(REDIS_URL, url), timeout=120, what="a sweeper to mark the broker")
        with tempfile.TemporaryDirectory() as tmp:
            # a warm-up job: the workers load their models and connect before the measure
            warm = write_prompts(Path(tmp) / "warm.jsonl", 4 * args.workers)
            run_cli(env, "submit", str(warm), *model, "--chunk-size", "1", "--wait", timeout=3600)
            for stale in [*counts_dir.glob("*.json"), *counts_dir.glob("*.tasks")]:
                stale.unlink()
            path = write_prompts(Path(tmp) / "p.jsonl", args.items)
            job_id = run_cli(env, "submit", str(path), *model, timeout=3600, check=True).stdout.strip()
        wait_for_job_end(url, job_id, timeout=24 * 3600, every=0.5)
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
        stop_all(workers, grace=60)

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
