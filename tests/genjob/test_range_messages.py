"""Range messages: ``publish_ranges`` copies one message Celery built; each is what ``send_task`` sends."""

from __future__ import annotations

import base64
import json
from typing import Any

import redis

from genjob.constants import TASK_GENERATE_CHUNK
from genjob.queueing import PUBLISH_RETRY_POLICY, chunk_summary, producer_app, publish_ranges, queue_keys
from tests.support.databases import REDIS_URL


def queued(queue: str) -> list[dict[str, Any]]:
    """The queue's messages, oldest first, without what differs between any two (ids, delivery tags)."""
    broker = redis.Redis.from_url(REDIS_URL)
    messages = []
    for key in queue_keys(queue):
        for raw in reversed(broker.lrange(key, 0, -1)):
            message = json.loads(raw)
            for field in ("id", "root_id"):
                assert message["headers"].pop(field) == message["properties"]["correlation_id"]
            del message["properties"]["correlation_id"], message["properties"]["delivery_tag"]
            messages.append(message)
    return messages


def test_a_range_message_is_what_send_task_sends(queue_name: str) -> None:
    app = producer_app(REDIS_URL)
    assert publish_ranges(app, job_id="job1", queue=queue_name, ranges=[(0, 64)]) == 1
    app.send_task(
        TASK_GENERATE_CHUNK,
        args=("job1", 0, 64),
        argsrepr=chunk_summary("job1", 0, 64),
        queue=queue_name,
        priority=0,
        retry=True,
        retry_policy=PUBLISH_RETRY_POLICY,
    )
    ours, celerys = queued(queue_name)
    assert ours == celerys


def test_each_message_has_its_own_id_and_range(queue_name: str) -> None:
    app = producer_app(REDIS_URL)
    ranges = [(start, start + 10) for start in range(0, 1200, 10)]
    assert publish_ranges(app, job_id="job2", queue=queue_name, ranges=ranges) == len(ranges)
    broker = redis.Redis.from_url(REDIS_URL)
    raws = [json.loads(raw) for key in queue_keys(queue_name) for raw in broker.lrange(key, 0, -1)]
    assert len({message["headers"]["id"] for message in raws}) == len(ranges)
    bodies = sorted(tuple(json.loads(base64.b64decode(m["body"]))[0]) for m in raws)
    assert bodies == sorted(("job2", start, stop) for start, stop in ranges)
