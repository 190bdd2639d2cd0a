"""One Settings object, read from ``GENJOB_*`` environment variables (and an optional ``.env``)."""

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from genjob.constants import DEFAULT_QUEUE

EMBEDDED_DATABASE_URL = "sqlite:///./genjob.db"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GENJOB_", env_file=".env", extra="ignore", frozen=True)

    database_url: str = Field(
        default=EMBEDDED_DATABASE_URL,
        description="SQLAlchemy URL; postgresql+psycopg://… in production, SQLite when embedded.",
    )
    broker_url: str | None = Field(
        default=None,
        description="Celery broker (redis://…). Unset: embedded mode, tasks run in-process.",
    )
    queue: str = Field(default=DEFAULT_QUEUE, description="Queue that submit pushes chunks to.")
    visibility_timeout_s: int = Field(
        default=6 * 3600,
        description="Redis visibility timeout: an unacked chunk is redelivered after this; "
        "must be longer than any chunk takes.",
    )
    chunk_size: int = Field(default=16, ge=1, description="Items per task message.")
    max_new_tokens: int = Field(default=128, ge=1, description="Default new tokens per item.")
    max_new_tokens_limit: int = Field(default=8192, ge=1, description="Largest max_new_tokens accepted.")
    max_line_bytes: int = Field(default=1 << 20, ge=1024, description="Longest accepted JSONL line.")
    max_upload_bytes: int = Field(default=512 << 20, ge=1024, description="Largest accepted prompt file.")
    guard_min_items: int = Field(
        default=2, ge=1, description="Sampled A/B items before the speedup guard may switch a job to plain."
    )
    guard_threshold: float = Field(
        default=1.0, ge=0.0, description="Measured speedup under which the guard switches to plain decoding."
    )
    device: str = Field(default="auto", description="torch device for workers: auto, cpu, cuda, cuda:1…")
    torch_threads: int | None = Field(default=None, ge=1, description="torch.set_num_threads in workers.")

    @property
    def embedded(self) -> bool:
        """No broker configured: run tasks in-process (Celery eager) instead of through a queue."""
        return not self.broker_url


@lru_cache
def get_settings() -> Settings:
    return Settings()
