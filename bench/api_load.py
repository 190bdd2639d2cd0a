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
import statistics
import sys
import threading
import time

import httpx
import repo_root  # noqa: F401 (the repository root on sys.path: tests.support)

from tests.support.databases import pg_database, throwaway_queue
from tests.support.processes import GENJOB, ServiceProcess, free_port, service_env, wait_until_serving

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
    out: dict[str, list] = {"status_ms": [], "status_codes": [], "submits": []}
    with pg_database("genjob_load") as url, throwaway_queue("load") as queue:
        port = free_port()
        env = service_env(
            url, queue, cost_cache_dir=None, api_keys=",".join(KEYS), models='{"m": "some/model"}'
        )
        with ServiceProcess([GENJOB, "api", "--port", str(port)], env):
            base = f"http://127.0.0.1:{port}"
            wait_until_serving(base)
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
