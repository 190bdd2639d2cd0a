"""Names shared by the CLI, the API and the workers: queues, task names, statuses.

One place, so that a producer and a consumer can never disagree on a string.
"""

from enum import StrEnum

DEFAULT_QUEUE = "gpu"

# Celery task names (readable in Flower).
TASK_GENERATE_CHUNK = "genjob.generate_chunk"


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


TERMINAL_JOB_STATUSES = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED}
)


class ItemStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


OPEN_ITEM_STATUSES = frozenset({ItemStatus.PENDING, ItemStatus.RUNNING})


class AttemptOutcome(StrEnum):
    """How one try of an item ended (the ``attempts`` table)."""

    DONE = "done"
    FAILED = "failed"  # raised, and no tries are left (or the error is permanent)
    RETRIED = "retried"  # raised, and the item is tried again
    LOST = "lost"  # its worker died or stalled: the lease ran out and the item was taken back
    SUPERSEDED = "superseded"  # finished after its lease was taken back: the result was dropped
    RELEASED = "released"  # given back unfinished by a worker that stopped (SIGTERM): the try is refunded
    STOPPED = "stopped"  # its job was cancelled or expired while it ran: it ends unfinished, as its job did


# Redis key (per database) whose absence tells the workers' sweeper that the broker lost its data.
BROKER_MARK_KEY = "genjob:broker-mark"


class DecodingMode(StrEnum):
    """How the worker decodes: with a draft model, with n-gram prompt lookup, plainly, or ``auto``:
    each row, each round, from whichever of the job's proposers pays it (prompt lookup, the job's
    suffix cache of its earlier outputs, and the draft model when the job has one)."""

    DRAFT = "draft"
    PROMPT_LOOKUP = "prompt-lookup"
    NONE = "none"
    AUTO = "auto"


class DraftSchedule(StrEnum):
    """How γ is chosen each round: the most expected tokens per second (goodput, 0..γmax), or γ fixed.

    ``heuristic`` is the old name of goodput, still accepted."""

    GOODPUT = "goodput"
    CONSTANT = "constant"
    HEURISTIC = "heuristic"


class InputFormat(StrEnum):
    """Line format of a prompt file: genjob's own, or the OpenAI batch request format."""

    GENJOB = "genjob"
    OPENAI = "openai"


class OpenAIEndpoint(StrEnum):
    """The OpenAI batch endpoints a request line may target (one per file, as OpenAI requires)."""

    COMPLETIONS = "/v1/completions"
    CHAT_COMPLETIONS = "/v1/chat/completions"
