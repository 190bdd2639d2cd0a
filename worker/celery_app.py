"""The Celery app: built from Settings, with the options a GPU batch worker needs.

``celery -A genjob.worker.celery_app worker`` (or ``genjob worker``) uses the module-level ``app``;
tests build their own with ``create_app(settings)``, no global is swapped. Producers need none of
this: they send by task name (``genjob.queueing``). Must not know: HTTP, the CLI.
"""

from __future__ import annotations

from functools import lru_cache

from celery import Celery

from genjob.constants import TASK_GENERATE_CHUNK
from genjob.redaction import install_log_masking, remember_url
from genjob.settings import Settings, get_settings


@lru_cache(maxsize=8)
def create_app(settings: Settings) -> Celery:
    """The worker's app for ``settings``: tasks registered, the sweeper added to the worker."""
    for url in (settings.database_url, settings.broker_url):
        remember_url(url)  # their passwords masked in every log line (genjob.redaction)
    install_log_masking()
    app = Celery("genjob", broker=settings.broker_url or "memory://", set_as_current=False)
    app.conf.update(
        task_default_queue=settings.queue,
        task_always_eager=settings.embedded,
        task_eager_propagates=True,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        # A chunk is acknowledged only once done; a worker that dies mid-chunk gets it redelivered.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # A chunk that ends in an exception (ChunkNotClean: items failed for good) is acknowledged
        # too: its outcome is recorded, and running it again would not change it.
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_hijack_root_logger=False,
        task_routes={TASK_GENERATE_CHUNK: {"queue": settings.queue}},
    )
    app.genjob_settings = settings
    from genjob.worker.tasks import register_tasks

    register_tasks(app)
    if not settings.embedded:
        from genjob.worker.sweeper import SweeperStep

        app.steps["worker"].add(SweeperStep)
    return app


app = create_app(get_settings())
