"""Queueing a stored job's items on the broker: task messages sent by name, never by the worker's code.

A message carries only (job id, item ids); the task's name and queue come from ``genjob.constants``,
so a producer (the CLI, the API, a sweeper) needs a broker URL, not the worker's Celery app.
Must not know: torch, the engine, the worker's tasks, HTTP.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from celery import Celery
from kombu.exceptions import OperationalError

from genjob import store
from genjob.constants import TASK_GENERATE_CHUNK
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.store import leases
from genjob.tables import utcnow

PUBLISH_RETRY_POLICY = {"max_retries": 5, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 3}


class BrokerUnavailable(RuntimeError):
    """The job is stored but its chunks could not be queued; ``genjob requeue`` can retry."""


@lru_cache(maxsize=8)
def producer_app(broker_url: str) -> Celery:
    """A Celery app that only sends messages (no tasks registered): JSON, the broker's URL."""
    app = Celery("genjob-producer", broker=broker_url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"], broker_connection_retry_on_startup=True)
    return app


def publish_chunks(app: Celery, *, job_id: str, queue: str, chunks: Iterable[list[int]]) -> int:
    """Send one task message per chunk (retrying a dropped broker connection); returns how many."""
    sent = 0
    try:
        with app.producer_or_acquire() as producer:
            for item_ids in chunks:
                app.send_task(
                    TASK_GENERATE_CHUNK,
                    args=(job_id, item_ids),
                    queue=queue,
                    producer=producer,
                    retry=True,
                    retry_policy=PUBLISH_RETRY_POLICY,
                )
                sent += 1
    except OperationalError as exc:
        raise BrokerUnavailable(
            f"job {job_id} is stored but could not be queued on {app.conf.broker_url}: {exc}"
        ) from exc
    return sent


def publish_pending(settings: Settings, *, job_id: str, chunk_size: int) -> int:
    """Push the job's pending items as chunks to its queue; returns how many chunks.

    Items whose lease ran out (their worker died) are taken back first; items leased to a live
    worker are left to it. Safe to repeat: workers skip items that are final or held by another.
    """
    assert settings.broker_url, "publish_pending needs a broker (embedded jobs run in-process)"
    with session_scope(settings.database_url) as session:
        leases.reclaim_expired_leases(session, job_id=job_id)
    with session_scope(settings.database_url) as session:
        queue = store.get_job(session, job_id=job_id).queue
        chunks = store.pending_item_chunks(
            session, job_id=job_id, chunk_size=chunk_size, unleased_at=utcnow()
        )
        return publish_chunks(producer_app(settings.broker_url), job_id=job_id, queue=queue, chunks=chunks)


PRIORITY_SEPARATOR = "\x06\x16"  # kombu's Redis transport keeps priority levels in lists `queue␆␖N`


def queue_depths(broker_url: str, queues: Iterable[str]) -> dict[str, int]:
    """Task messages waiting in each queue (Redis brokers; empty for others or when it is down)."""
    if not broker_url.startswith(("redis://", "rediss://")):
        return {}
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        depths = {}
        for queue in sorted(set(queues)):
            keys = [queue, *(f"{queue}{PRIORITY_SEPARATOR}{level}" for level in (3, 6, 9))]
            pipe = client.pipeline()
            for key in keys:
                pipe.llen(key)
            depths[queue] = sum(pipe.execute())
        return depths
    except redis.RedisError:
        return {}
    finally:
        client.close()
