"""Celery workers: load target + draft once per process and run assisted generation on chunks."""
