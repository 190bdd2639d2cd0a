"""Queueing a stored job's items on the broker: task messages sent by name, never by the worker's code.

A message names a job and a range of its items, ``(job id, start, stop)``: items with ``seq`` in
[start, stop); the worker reads the rest from the database. The task's name and queue come from
``genjob.constants``, so a producer (the CLI, the API, a sweeper) needs a broker URL, not the
worker's Celery app. Messages are published pipelined (one Redis round trip per
``MESSAGES_PER_PUBLISH``), and after each round trip the job records how far it has queued
(``jobs.queued_seq``):
a publisher that stops half-way (a submit killed mid-enqueue, a broker that went away) is finished
by a worker's sweeper, and ``genjob requeue`` sends only what is missing.

Fairness within a queue: a job's first chunks go out at a higher priority than its later ones
(Redis' priority lists, which every worker polls highest first), so a small job submitted after a
huge one on the same queue is taken by each worker at its next chunk, not after the huge one.
Must not know: torch, the engine, the worker's tasks, HTTP.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError
from kombu.utils.uuid import uuid
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from genjob import store
from genjob.constants import BROKER_MARK_KEY, TASK_GENERATE_CHUNK
from genjob.db import run_transaction, session_scope
from genjob.redaction import mask_text, mask_url
from genjob.settings import Settings
from genjob.store import leases
from genjob.tables import utcnow

log = logging.getLogger(__name__)

PUBLISH_RETRY_POLICY = {"max_retries": 5, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 3}
BROKER_MARK_TTL_S = 86400  # the broker marker outlives the last sweep by a day
MESSAGES_PER_PUBLISH = 500  # messages per pipelined round trip, and per progress record
# (first chunk index, priority): Redis' lists are polled 0 first; kombu keeps levels 0, 3, 6, 9.
PRIORITY_BY_CHUNK = ((0, 0), (1, 3), (4, 6), (16, 9))


class BrokerUnavailable(RuntimeError):
    """The job is stored but its chunks could not be queued; ``genjob requeue`` can retry.

    Its message names the broker and the reason with the password masked (``mask_url``), for the
    CLI's user and the server's log; an API client gets neither (``job_id`` alone)."""

    def __init__(self, job_id: str, broker_url: str, reason: object) -> None:
        broker, why = mask_url(broker_url), mask_text(str(reason))
        super().__init__(f"job {job_id} is stored but could not be queued on {broker}: {why}")
        self.job_id = job_id


def broker_mark_key(database_url: str) -> str:
    """The marker's key: one per database, so deployments sharing a Redis do not mix.

    It names the database (backend, host, port, name), not the URL: the driver, the password and
    query options (``?application_name=``, ``sslmode=``) differ between the API, the CLI and the
    workers of one deployment, and a worker that found no marker under its own spelling would
    think the broker had lost its queues and queue every pending item again."""
    url = make_url(database_url)
    identity = f"{url.get_backend_name()}://{url.host or ''}:{url.port or ''}/{url.database or ''}"
    return f"{BROKER_MARK_KEY}:{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def queue_everything(settings: Settings, *, queue: str, queued_seq: int, everything: bool) -> bool:
    """Whether ``publish_pending`` queues every pending item no live worker holds: asked to
    (``everything``), or the broker lost what this job had queued (``broker_lost_queue``; a job that
    queued nothing yet, a new job's submit, has nothing to lose and keeps its ranged enqueue)."""
    return everything or (queued_seq > 0 and broker_lost_queue(settings, queue))


def recover_lost_queues(
    settings: Settings, app: Celery, *, max_attempts: int, chunk_size: int | None = None
) -> dict[str, int] | None:
    r"""Where the broker lost its queues (Redis flushed, or restarted without persistence: the marker
    key ``broker_mark_key`` is gone), queue the pending items of every live job again, once.

    The marker is set first (SET NX, ``BROKER_MARK_TTL_S``): of the sweepers and ``genjob requeue``\s
    that notice the loss, one queues; the others, and every later one until the broker loses its data
    again, find the marker and queue nothing. Expired leases are taken back first, so their items are
    queued with the rest, once, ``chunk_size`` items a message (default GENJOB_CHUNK_SIZE). Returns the
    chunks sent by job id; None where nothing was lost (the
    marker is there; each call keeps it alive) or the broker is not Redis or does not answer."""
    broker = settings.broker_url or ""
    if not broker.startswith(("redis://", "rediss://")):
        return None
    import redis

    client = redis.Redis.from_url(broker, socket_timeout=5, socket_connect_timeout=5)
    key = broker_mark_key(settings.database_url)
    try:
        if not client.set(key, utcnow().isoformat(), nx=True, ex=BROKER_MARK_TTL_S):
            client.expire(key, BROKER_MARK_TTL_S)  # kept alive by every sweep, gone a day after the last
            return None
        try:
            size = settings.option_or_setting("chunk_size", chunk_size)
            return _queue_pending_of_live_jobs(settings, app, max_attempts=max_attempts, chunk_size=size)
        except BaseException:
            client.delete(key)  # not queued: the next sweep or requeue tries again
            raise
    except redis.RedisError as exc:
        log.debug("no broker marker: %s", exc)
        return None
    finally:
        client.close()


def _queue_pending_of_live_jobs(
    settings: Settings, app: Celery, *, max_attempts: int, chunk_size: int
) -> dict[str, int]:
    with session_scope(settings.database_url) as session:
        leases.reclaim_expired_leases(session, max_attempts=max_attempts)
    sent: dict[str, int] = {}
    with session_scope(settings.database_url) as session:
        for job_id, queue in store.live_jobs_with_pending_items(session):
            ranges = store.pending_ranges(session, job_id=job_id, chunk_size=chunk_size, unleased_at=utcnow())
            sent[job_id] = publish_ranges(app, job_id=job_id, queue=queue, ranges=ranges)
    if any(sent.values()):
        log.warning(
            "the broker had lost its queues (no %s): queued %d chunks again (of %d jobs)",
            BROKER_MARK_KEY,
            sum(sent.values()),
            sum(1 for count in sent.values() if count),
        )
    return sent


def broker_lost_queue(settings: Settings, queue: str) -> bool:
    """Whether the broker (Redis) has lost what was queued on ``queue``: the queue holds no message
    at all (``queue_depths``), or the workers' marker key is gone (a restart without persistence, a
    flush: see the sweeper). A broker that does not answer (or is not Redis): no, the publish that
    follows says so."""
    broker = settings.broker_url or ""
    depth = queue_depths(broker, [queue]).get(queue)
    if not depth:
        return depth == 0
    import redis

    client = redis.Redis.from_url(broker, socket_timeout=5, socket_connect_timeout=5)
    try:
        return not client.exists(broker_mark_key(settings.database_url))
    except redis.RedisError:
        return False
    finally:
        client.close()


def chunk_priority(index: int) -> int:
    """The priority of a job's ``index``-th chunk (0 first): its first chunks before others' later ones."""
    level = 0
    for first, priority in PRIORITY_BY_CHUNK:
        if index >= first:
            level = priority
    return level


def chunk_summary(job_id: str, start: int, stop: int) -> str:
    """How a chunk reads in Flower: ``job=abc123 items 100-163`` (seq, inclusive)."""
    return f"job={job_id} items {start}-{stop - 1}"


@lru_cache(maxsize=8)
def producer_app(broker_url: str) -> Celery:
    """A Celery app that only sends messages (no tasks registered): JSON, the broker's URL."""
    app = Celery("genjob-producer", broker=broker_url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"], broker_connection_retry_on_startup=True)
    return app


def publish_ranges(
    app: Celery,
    *,
    job_id: str,
    queue: str,
    ranges: Iterable[tuple[int, int]],
    first_index: int = 0,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Send one task message per ``[start, stop)`` range, pipelined, ``MESSAGES_PER_PUBLISH`` a round trip;
    ``on_batch(stop)`` hears how far each flushed batch reached. Returns how many were sent.

    The messages are what ``app.send_task`` sends, built faster: Celery builds the first one, the
    others copy it with their own id and range (``_RangeMessages``), and the queue is declared once."""
    import redis

    sent = 0
    messages = _RangeMessages(app, job_id)
    try:
        with app.producer_or_acquire() as producer:
            batch_stop = None
            with producer.batch(max_size=MESSAGES_PER_PUBLISH * 2) as batch:
                for start, stop in ranges:
                    app.amqp.send_task_message(
                        producer,
                        TASK_GENERATE_CHUNK,
                        messages.of(start, stop),
                        queue=queue,
                        priority=chunk_priority(first_index + sent),
                        declare=None if sent == 0 else [],  # None: the queue, declared by the first
                        retry=True,
                        retry_policy=PUBLISH_RETRY_POLICY,
                    )
                    sent += 1
                    batch_stop = stop
                    if sent % MESSAGES_PER_PUBLISH == 0:
                        batch.flush()
                        if on_batch is not None:
                            on_batch(stop)
                        batch_stop = None
                batch.flush()
            if on_batch is not None and batch_stop is not None:
                on_batch(batch_stop)
    except (OperationalError, redis.RedisError, ConnectionError) as exc:
        raise BrokerUnavailable(job_id, str(app.conf.broker_url), exc) from exc
    return sent


class _RangeMessages:
    """A job's range messages (Celery's protocol 2: headers, properties, body), each a copy of one
    that ``app.amqp.create_task_message`` built, with its own task id, range and ``argsrepr``;
    building each whole costs about as much again as sending it."""

    def __init__(self, app: Celery, job_id: str) -> None:
        self.job_id = job_id
        self.headers, self.properties, body, _event = app.amqp.create_task_message(
            "template", TASK_GENERATE_CHUNK, (job_id, 0, 0), {}, reply_to=app.thread_oid, ignore_result=None
        )
        _args, self.kwargs, self.embed = body

    def of(self, start: int, stop: int) -> tuple[dict[str, Any], dict[str, Any], tuple[Any, ...], None]:
        task_id = uuid()
        summary = chunk_summary(self.job_id, start, stop)
        headers = dict(self.headers, id=task_id, root_id=task_id, argsrepr=summary)
        properties = dict(self.properties, correlation_id=task_id, argsrepr=summary)  # as send_task
        return headers, properties, ((self.job_id, start, stop), self.kwargs, self.embed), None


def publish_rest(
    app: Celery, *, database_url: str, job_id: str, queue: str, start: int, stop: int, chunk_size: int
) -> int:
    """Queue the job's items from ``start`` (its ``queued_seq``) to ``stop`` (its total), recording
    the progress after every pipelined batch. Returns the messages sent."""

    def progress(queued_seq: int) -> None:
        run_transaction(database_url, store.record_queued, job_id=job_id, queued_seq=queued_seq)

    ranges = store.seq_ranges(start, stop, chunk_size)
    return publish_ranges(
        app, job_id=job_id, queue=queue, ranges=ranges, first_index=start // chunk_size, on_batch=progress
    )


def chunks_to_queue(
    settings: Settings, *, job_id: str, chunk_size: int, max_attempts: int, everything: bool = False
) -> int:
    """How many messages ``publish_pending`` would send now, sending and changing nothing
    (``genjob requeue --dry-run``)."""
    now = utcnow()
    with session_scope(settings.database_url) as session:
        job = store.get_job(session, job_id=job_id)
        if queue_everything(settings, queue=job.queue, queued_seq=job.queued_seq, everything=everything):
            return sum(
                1
                for _ in store.pending_ranges(session, job_id=job_id, chunk_size=chunk_size, unleased_at=now)
            )
        lost = leases.expired_lease_seqs(session, job_id=job_id, now=now, max_attempts=max_attempts)
        unqueued = store.seq_ranges(job.queued_seq, job.total, chunk_size)
        return sum(1 for _ in store.seq_runs(lost, chunk_size)) + sum(1 for _ in unqueued)


def publish_pending(
    settings: Settings, *, job_id: str, chunk_size: int, max_attempts: int, everything: bool = False
) -> int:
    """Queue what the job is missing; returns how many messages were sent (0: nothing was missing).

    Items whose lease ran out (their worker died) are taken back and queued first; then the items
    its publisher never queued (from ``jobs.queued_seq``). With ``everything``, or where the broker
    lost what was queued (``broker_lost_queue``: flushed, restarted without persistence), every
    pending item not leased to a live worker is queued again (also after a retry); a broker that
    lost its marker has every live job's pending items queued again, once (``recover_lost_queues``,
    as the sweepers do), and the count returned is this job's.
    Idempotent: once it has queued, a repeat queues nothing until something is lost again (a lease
    runs out, the broker loses its queues), except with ``everything``; workers skip items that are
    final or held by another.
    """
    assert settings.broker_url, "publish_pending needs a broker (embedded jobs run in-process)"
    app = producer_app(settings.broker_url)
    sent = 0

    def reclaim_and_queue(session: Session) -> int:  # queued before the reset commits
        reclaimed = leases.reclaim_expired_leases(session, job_id=job_id, max_attempts=max_attempts)
        count = 0
        for queue, seqs in reclaimed.values():
            ranges = store.seq_runs(seqs, chunk_size)
            count += publish_ranges(app, job_id=job_id, queue=queue, ranges=ranges)
        store.finalize_job(session, job_id=job_id)
        return count

    with session_scope(settings.database_url) as session:
        job = store.get_job(session, job_id=job_id)
        queue, queued_seq, total = job.queue, job.queued_seq, job.total
    recovered = (
        None
        if everything
        else recover_lost_queues(settings, app, max_attempts=max_attempts, chunk_size=chunk_size)
    )
    if recovered is not None:  # the broker lost its queues: every live job's pending items went out once
        run_transaction(settings.database_url, store.record_queued, job_id=job_id, queued_seq=total)
        return recovered.get(job_id, 0)
    if queue_everything(settings, queue=queue, queued_seq=queued_seq, everything=everything):
        with session_scope(settings.database_url) as session:
            leases.reclaim_expired_leases(session, job_id=job_id, max_attempts=max_attempts)
        with session_scope(settings.database_url) as session:
            ranges = store.pending_ranges(session, job_id=job_id, chunk_size=chunk_size, unleased_at=utcnow())
            sent += publish_ranges(app, job_id=job_id, queue=queue, ranges=ranges)
        run_transaction(settings.database_url, store.record_queued, job_id=job_id, queued_seq=total)
        return sent
    sent += run_transaction(settings.database_url, reclaim_and_queue)
    if queued_seq < total:
        sent += publish_rest(
            app,
            database_url=settings.database_url,
            job_id=job_id,
            queue=queue,
            start=queued_seq,
            stop=total,
            chunk_size=chunk_size,
        )
    return sent


PRIORITY_SEPARATOR = "\x06\x16"  # kombu's Redis transport keeps priority levels in lists `queue␆␖N`


def queue_keys(queue: str) -> list[str]:
    """The Redis lists that hold a queue's messages: the queue and its priority levels 3, 6, 9."""
    return [queue, *(f"{queue}{PRIORITY_SEPARATOR}{level}" for level in (3, 6, 9))]


def queue_depths(broker_url: str, queues: Iterable[str]) -> dict[str, int]:
    """Task messages waiting in each queue (Redis brokers; empty for others or when it is down)."""
    if not broker_url.startswith(("redis://", "rediss://")):
        return {}
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        depths = {}
        for queue in sorted(set(queues)):
            pipe = client.pipeline()
            for key in queue_keys(queue):
                pipe.llen(key)
            depths[queue] = sum(pipe.execute())
        return depths
    except redis.RedisError:
        return {}
    finally:
        client.close()


PING_TIMEOUT_S = 0.5


def online_workers(broker_url: str, timeout: float = PING_TIMEOUT_S) -> set[str] | None:
    """The node names (``genjob@host``) of the workers that answer a ping within ``timeout`` seconds;
    None when the broker cannot be asked (down, or no remote control on its transport)."""
    app = producer_app(broker_url)
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1)  # a broker that is down: no minute of retries
            replies = app.control.ping(timeout=timeout, connection=connection)
    except (OperationalError, OSError, NotImplementedError) as exc:
        log.debug("no ping through the broker: %s", exc)
        return None
    return {name for reply in replies for name in reply}
