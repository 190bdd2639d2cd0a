"""Celery tasks. A message carries only (job id, item ids), never prompts: the database has them."""

from __future__ import annotations

import logging

from celery import Celery, Task
from celery.signals import worker_process_init

from genjob.constants import TASK_GENERATE_CHUNK
from genjob.db import RETRYABLE_DB_ERRORS

log = logging.getLogger(__name__)

MAX_TASK_RETRY_DELAY_S = 60


def register_tasks(app: Celery) -> None:
    settings = app.genjob_settings

    @worker_process_init.connect(weak=False)
    def _limit_threads(**_kwargs) -> None:
        if settings.torch_threads:
            import torch

            torch.set_num_threads(settings.torch_threads)

    # shared=False: a task of one app (its settings) must never be lent to another app.
    @app.task(name=TASK_GENERATE_CHUNK, bind=True, shared=False)
    def generate_chunk(self: Task, job_id: str, item_ids: list[int]) -> dict:
        """Generate the items ``item_ids`` of job ``job_id`` and store their results."""
        from genjob.worker.chunks import process_chunk  # torch loads in the worker only
        from genjob.worker.leasing import worker_name

        worker = self.request.hostname or worker_name()
        try:
            outcome = process_chunk(
                settings=self.app.genjob_settings, job_id=job_id, item_ids=item_ids, worker=worker
            )
        except RETRYABLE_DB_ERRORS as exc:
            # The database stayed away longer than db_retry_s. Acking would lose the chunk's
            # unreserved items, so queue the chunk again, later (backoff, no limit).
            if self.request.is_eager:
                raise
            delay = min(5 * 2**self.request.retries, MAX_TASK_RETRY_DELAY_S)
            log.error("job %s: database unavailable (%s); chunk queued again in %d s", job_id, exc, delay)
            raise self.retry(exc=exc, countdown=delay, max_retries=None) from exc
        log.info("job %s chunk of %d: %s", job_id, len(item_ids), outcome)
        return {"done": outcome.done, "failed": outcome.failed, "skipped": outcome.skipped}
