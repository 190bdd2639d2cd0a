"""Submit the same JSONL file through the CLI and through the HTTP API, interleaved, and compare.

Both run the same validation and insert code; the API adds spooling the upload (memory, then a temp
file) and the HTTP framing. Prints seconds and lines/s per path (median of the repeats) and their
ratio. Needs Postgres (migrated) and Redis; jobs are queued on a throwaway queue and deleted after.

    .venv/bin/python bench/api_submit.py --database-url postgresql+psycopg://postgres@127.0.0.1/genjob_bench
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import repo_root  # noqa: F401 (the repository root on sys.path: tests.support)
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import delete

from genjob.api.app import create_app
from genjob.cli import main as cli
from genjob.db import session_scope
from genjob.settings import Settings, get_settings
from genjob.tables import Job
from tests.support.databases import throwaway_queue
from tests.support.prompts import prompts_file

API_KEY = "bench"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with throwaway_queue("bench", args.broker_url) as queue:
        compare(args, queue)


def compare(args: argparse.Namespace, queue: str) -> None:
    env = {
        "GENJOB_DATABASE_URL": args.database_url,
        "GENJOB_BROKER_URL": args.broker_url,
        "GENJOB_QUEUE": queue,
        "GENJOB_MODELS": json.dumps({"bench": "bench/model"}),
        "GENJOB_CHUNK_SIZE": "64",
    }
    os.environ.update(env)
    get_settings.cache_clear()
    settings = Settings(api_keys=(API_KEY,))
    client = TestClient(create_app(settings), headers={"Authorization": f"Bearer {API_KEY}"})
    times: dict[str, list[float]] = {"cli": [], "api multipart": [], "api jsonl body": []}
    job_ids = []
    with tempfile.TemporaryDirectory() as tmp:
        pad = "pad " * 16
        path = prompts_file(
            Path(tmp) / "prompts.jsonl",
            (f"def function_{i}(x, y):  # {pad}" for i in range(args.lines)),
            id_format="q{}",
        )
        size = path.stat().st_size
        body = path.read_bytes()
        for _ in range(args.repeats):
            started = time.perf_counter()
            result = CliRunner().invoke(cli, ["submit", str(path), "-m", "bench"])
            times["cli"].append(time.perf_counter() - started)
            assert result.exit_code == 0, result.output
            job_ids.append(result.output.strip())

            started = time.perf_counter()
            response = client.post("/v1/jobs", params={"model": "bench"}, files={"file": ("p.jsonl", body)})
            times["api multipart"].append(time.perf_counter() - started)
            assert response.status_code == 201, response.text
            job_ids.append(response.json()["id"])

            started = time.perf_counter()
            response = client.post(
                "/v1/jobs",
                params={"model": "bench"},
                content=body,
                headers={"Content-Type": "application/jsonl"},
            )
            times["api jsonl body"].append(time.perf_counter() - started)
            assert response.status_code == 201, response.text
            job_ids.append(response.json()["id"])
    with session_scope(args.database_url) as session:
        session.execute(delete(Job).where(Job.id.in_(job_ids)))

    print(f"{args.lines} lines, {size / 1e6:.1f} MB, median of {args.repeats}")
    print(f"{'path':<16} {'seconds':>8} {'lines/s':>9} {'vs cli':>7}")
    cli_median = statistics.median(times["cli"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:<16} {median:8.2f} {args.lines / median:9.0f} {median / cli_median:6.2f}x")


if __name__ == "__main__":
    main()
