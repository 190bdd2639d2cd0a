"""Job specs from keyword options, as the CLI and the API build them (``catalog.job_spec``)."""

from __future__ import annotations

from typing import Any

from genjob.catalog import job_spec, parse_job_options
from genjob.options import JobSpec
from genjob.settings import Settings


def build_job_spec(settings: Settings, *, allow_paths: bool, **options: Any) -> JobSpec:
    """``job_spec`` from keyword options (``model=...``, ``mode=...``), checked by JobOptions."""
    return job_spec(settings, parse_job_options(options), allow_paths=allow_paths)
