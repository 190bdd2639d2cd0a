"""API under load: 30 clients on two API keys polling their jobs' status and submitting one-line jobs.

A live ``genjob api`` (Granian) on a fresh Postgres database and the local Redis, its own queue, no
workers: each client, for ``--seconds``, asks for its job's status (``GET /v1/jobs/{id}``) every
``--interval`` seconds (a user's poll, not a closed loop), and every ``--submit-every``-th request
submits a one-line job. Reports the status calls' p50/p99 and how many
submits were refused (503: an upload under 1 MiB takes no upload slot, so none should be). Bounded in
count and time; loopback only.

    .venv/bin/python bench/api_load.py [--clients 30] [--seconds 60] [--interval 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import redis
from sqlalchemy import create_engine, text

from genjob import db
from genjob.queueing import queue_keys

GENJOB = str(Path(sys.executable).with_name("genjob"))
PG_ADMIN_URL = os.environ.get(
    "GENJOB_BENCH_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("GENJOB_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
KEYS = ("load-key-a-0123456789", "load-key-b-0123456789")
LINE = b'{"prompt": "def f(x):"}\n'


def client_loop(
    base: str, key: str, seconds: float, interval: float, submit_every: int, out: dict[str, list]
) -> None:
    """One client: its own job, then status calls (every ``submit_every``-th a submit) until time is up."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/jsonl"}
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        job = client.post("/v1/jobs", params={"model": "m"}, content=LINE).json()["id"]
        deadline, number = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            time.sleep(interval)
            number += 1
            if number % submit_every == 0:
                status = client.post("/v1/jobs", params={"model": "m"}, content=LINE).status_code
                out["submits"].append(status)
                continue
            started = time.perf_counter()
            response = client.get(f"/v1/jobs/{job}")
            out["status_ms"].append((time.perf_counter() - started) * 1e3)
            out["status_codes"].append(response.status_code)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between a client's requests")
    parser.add_argument("--submit-every", type=int, default=10)
    args = parser.parse_args()
    name = f"genjob_load_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    db.upgrade(url)
    queue, port = f"load-{uuid.uuid4().hex[:6]}", 18000 + os.getpid() % 1000
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENJOB_")}
    env.update(
        GENJOB_DATABASE_URL=url,
        GENJOB_BROKER_URL=REDIS_URL,
        GENJOB_QUEUE=queue,
        GENJOB_API_KEYS=",".join(KEYS),
        GENJOB_MODELS='{"m": "some/model"}',
    )
    api = subprocess.Popen(
        [GENJOB, "api", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    out: dict[str, list] = {"status_ms": [], "status_codes": [], "submits": []}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/healthz", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        threads = [
            threading.Thread(
                target=client_loop,
                args=(base, KEYS[i % 2], args.seconds, args.interval, args.submit_every, out),
            )
            for i in range(args.clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        api.terminate()
        api.wait(timeout=30)
        redis.Redis.from_url(REDIS_URL).delete(*queue_keys(queue))
        admin.dispose()
        with create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT").connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    ms = sorted(out["status_ms"])
    p50, p99 = statistics.median(ms), ms[int(0.99 * (len(ms) - 1))]
    refused = sum(status == 503 for status in out["submits"])
    bad = sum(code != 200 for code in out["status_codes"])
    print(
        f"# {args.clients} clients on {len(KEYS)} keys for {args.seconds:g} s, a request every "
        f"{args.interval:g} s each, one submit every {args.submit_every} requests"
    )
    print("| status calls | p50 ms | p99 ms | non-200 | one-line submits | refused (503) |")
    print("|---|---|---|---|---|---|")
    print(f"| {len(ms)} | {p50:.1f} | {p99:.1f} | {bad} | {len(out['submits'])} | {refused} |")
    return 0 if p99 < 100 and not refused and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
