"""``genjob requeue`` is idempotent, and the sweeper agrees: after the broker lost its queues (a real
FLUSHALL of a redis-server of the test's own), two requeues and a sweep queue each chunk once."""

from __future__ import annotations

import base64
import json
from collections import Counter

import pytest
import redis
from click.testing import CliRunner

from genjob import db, store
from genjob.cli import main
from genjob.db import session_scope
from genjob.formats.reader import PromptItem
from genjob.options import JobSpec
from genjob.queueing import publish_pending, queue_keys
from genjob.settings import Settings, get_settings
from genjob.worker.celery_app import create_app
from genjob.worker.sweeper import Sweeper, broker_mark_key
from tests.support.processes import RedisServer


def queued_ranges(broker_url: str, queue: str) -> Counter[tuple[str, int, int]]:
    """(job id, start, stop) of every task message waiting in ``queue``, with how often each waits."""
    client = redis.Redis.from_url(broker_url)
    ranges: Counter[tuple[str, int, int]] = Counter()
    for key in queue_keys(queue):
        for raw in client.lrange(key, 0, -1):
            args = json.loads(base64.b64decode(json.loads(raw)["body"]))[0]
            ranges[(args[0], args[1], args[2])] += 1
    return ranges


def requeue(job_id: str) -> str:
    get_settings.cache_clear()
    result = CliRunner().invoke(main, ["requeue", job_id], prog_name="genjob")
    assert result.exit_code == 0, result.output
    return result.output


def test_two_requeues_and_a_sweep_after_a_flushall_queue_each_chunk_once(
    blank_pg_url: str, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.upgrade(blank_pg_url)
    settings = Settings(database_url=blank_pg_url, broker_url=own_redis.url, queue="gpu", chunk_size=2)
    for name in ("database_url", "broker_url", "queue", "chunk_size"):
        monkeypatch.setenv(f"GENJOB_{name.upper()}", str(getattr(settings, name)))
    sweeper = Sweeper(create_app(settings))
    sweeper.sweep()  # a worker's sweeper marks the broker
    with session_scope(blank_pg_url) as session:
        items = [PromptItem(i, i + 1, f"p{i}", None, None) for i in range(20)]
        job_id = store.create_job(session, spec=JobSpec(model="m", mode="none"), items=items, queue="gpu").id
    assert publish_pending(settings, job_id=job_id, chunk_size=2, max_attempts=3) == 10  # its submit
    every_chunk = Counter({(job_id, start, start + 2): 1 for start in range(0, 20, 2)})
    assert queued_ranges(own_redis.url, "gpu") == every_chunk

    redis.Redis.from_url(own_redis.url).flushall()
    assert requeue(job_id) == f"queued 10 chunks of job {job_id}\n"
    assert redis.Redis.from_url(own_redis.url).exists(broker_mark_key(blank_pg_url))
    assert requeue(job_id) == (
        f"job {job_id} is missing nothing: its items are queued or held by workers (--all: again)\n"
    )
    assert sweeper.sweep().recovered_chunks == 0
    assert queued_ranges(own_redis.url, "gpu") == every_chunk

    redis.Redis.from_url(own_redis.url).flushall()  # lost again: the sweeper notices first this time
    assert sweeper.sweep().recovered_chunks == 10
    assert requeue(job_id) == (
        f"job {job_id} is missing nothing: its items are queued or held by workers (--all: again)\n"
    )
    assert queued_ranges(own_redis.url, "gpu") == every_chunk
