"""Job options, each declared once: its name, type, default, range and help.

``JobOptions`` is what a submit asks for; the CLI's ``submit`` options (``genjob.cli.options``) and
the API's ``POST /v1/jobs`` query parameters are both generated from it, so a new option is one
field here. ``JobSpec`` is what the job row stores for the workers: the decoding options as given
(``DecodingOptions``, shared by both classes), the models resolved to what the workers load, and
the defaults that depend on Settings filled in (``genjob.catalog.job_spec`` does that).
Must not know: click, FastAPI, torch, the workers.
"""

from __future__ import annotations

from typing import Annotated, Any, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from genjob.constants import DecodingMode, DraftSchedule, InputFormat, OpenAIEndpoint

NO_CONTROL_CHARACTERS = r"^[^\x00-\x1f\x7f]*$"
MODEL_NAME_CHARS = 500
T = TypeVar("T")

# The defaults and bounds that Settings may change (GENJOB_MAX_NEW_TOKENS, GENJOB_MAX_NEW_TOKENS_LIMIT,
# GENJOB_BATCH_SIZE), declared here once: Settings, the JobSpec and the line readers take them from here.
DEFAULT_MAX_NEW_TOKENS = 128
MAX_NEW_TOKENS_LIMIT = 8192
MAX_BATCH_SIZE = 256
# Rows per forward pass, as a job asks (--batch-size) and a worker's default (GENJOB_BATCH_SIZE).
BatchSize = Annotated[int | None, Field(ge=1, le=MAX_BATCH_SIZE)]


def max_new_tokens_problem(value: int, limit: int) -> str | None:
    """Why ``value`` is no max_new_tokens a job or a line may ask for (1..``limit``), or None: the one
    range check, for the job's option (``genjob.catalog``) and each line's (``genjob.formats.reader``)."""
    if 1 <= value <= limit:
        return None
    return f"must be between 1 and {limit}, got {value}"


def line_or_job(line_value: T | None, job_value: T) -> T:
    """An item's setting (max_new_tokens, temperature, top_p): its line's value wins over the job's."""
    return job_value if line_value is None else line_value


class DecodingOptions(BaseModel):
    """How the workers decode every item of a job; stored on the job as given (or defaulted)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    draft_tokens: int = Field(
        default=8,
        ge=1,
        le=64,
        description="γmax: the most draft tokens a round proposes (goodput picks 0..γmax each round; "
        "constant proposes exactly this many).",
    )
    schedule: DraftSchedule = Field(
        default=DraftSchedule.GOODPUT,
        description="goodput: each round the γ with the most expected tokens per second from the "
        "measured costs and acceptance (0 = plain decoding); constant: always --draft-tokens "
        "(heuristic: the old name of goodput).",
    )
    prompt_lookup_tokens: int = Field(
        default=10, ge=1, le=64, description="γmax in mode prompt-lookup: the most tokens a round proposes."
    )
    temperature: float = Field(default=0.0, ge=0.0, le=10.0, description="0 = greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    seed: int | None = Field(
        default=None, ge=0, le=2**63 - 1, description="Seed for sampling; seeded runs repeat exactly."
    )
    batch_size: BatchSize = Field(
        default=None,
        description="Prompts decoded together per forward pass, in every mode (default: "
        "GENJOB_BATCH_SIZE, else a probe of the device); 1 decodes one prompt at a time.",
    )
    baseline_fraction: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="Share of rounds decoded plainly to measure the speedup (probe rounds), and of "
        "greedy items checked against plain decoding (the lossless rate: the last of every 1/F items).",
    )

    @property
    def baseline_every(self) -> int:
        """One round (and greedy item) in how many is decoded plainly: 1/baseline_fraction; 0: none."""
        return round(1 / self.baseline_fraction) if self.baseline_fraction > 0 else 0

    def decoding(self) -> dict[str, Any]:
        """The decoding options alone, as keyword arguments (for a JobSpec)."""
        return self.model_dump(include=set(DecodingOptions.model_fields))


class JobOptions(DecodingOptions):
    """Everything a submit may set: the models by name, the input format, the decoding options and
    how the job is queued. Unset options take their defaults when the JobSpec is built."""

    model: str = Field(
        min_length=1,
        max_length=MODEL_NAME_CHARS,
        description="Target model: a name from GENJOB_MODELS (its draft comes with it); "
        "on the CLI also a hub id or a local path.",
    )
    assistant: str | None = Field(
        default=None,
        min_length=1,
        max_length=MODEL_NAME_CHARS,
        description="Draft model sharing the target's tokenizer: a name from GENJOB_MODELS (on the CLI "
        "also a hub id or a path); default: the model's own draft.",
    )
    input_format: InputFormat = Field(
        default=InputFormat.GENJOB,
        description="genjob lines, or OpenAI batch request lines (chat messages go through the chat "
        "template).",
    )
    mode: DecodingMode | None = Field(
        default=None,
        description="auto (the default: per row, per round, the proposer that pays, or none: prompt "
        "lookup, the job's own earlier outputs, and the draft model when there is one), draft, "
        "prompt-lookup, or none (plain decoding).",
    )
    # No range here: its bounds are Settings (1..GENJOB_MAX_NEW_TOKENS_LIMIT), checked by the catalog.
    max_new_tokens: int | None = Field(
        default=None,
        description="New tokens per item unless its line says otherwise (default GENJOB_MAX_NEW_TOKENS).",
    )
    chunk_size: int | None = Field(
        default=None, ge=1, le=10_000, description="Items per task message (default GENJOB_CHUNK_SIZE)."
    )
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=NO_CONTROL_CHARACTERS,
        description="A name to find the job by.",
    )


class JobSpec(DecodingOptions):
    """What the job row stores for the workers (an item may override ``max_new_tokens``): the
    decoding options plus the models as the workers load them (hub ids or paths, never names)."""

    model: str = Field(min_length=1, max_length=MODEL_NAME_CHARS, description="Target: hub id or path.")
    assistant: str | None = Field(
        default=None,
        min_length=1,
        max_length=MODEL_NAME_CHARS,
        description="Draft model (mode 'draft'; mode 'auto' may have one).",
    )
    mode: DecodingMode = DecodingMode.AUTO
    max_new_tokens: int = Field(default=DEFAULT_MAX_NEW_TOKENS, ge=1)
    endpoint: OpenAIEndpoint | None = Field(
        default=None,
        description="OpenAI batch endpoint of the input lines (None: genjob lines); shapes openai output.",
    )

    @model_validator(mode="after")
    def _assistant_matches_mode(self) -> Self:
        if self.mode is DecodingMode.DRAFT and not self.assistant:
            raise ValueError("mode 'draft' needs an assistant (draft) model")
        if self.mode not in (DecodingMode.DRAFT, DecodingMode.AUTO) and self.assistant:
            raise ValueError(f"mode '{self.mode}' takes no assistant model")
        return self

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0

    @property
    def lossless_every(self) -> int:
        """The lossless check samples one item in this many (0: none, in plain or sampled jobs): the last
        of each run of ``baseline_every`` (seq 1/F − 1, 2/F − 1, …), so it costs a job at most F of its
        items whatever its size, and a job of fewer has none checked (checking its first always cost an
        8-item job an eighth more decoding, and a twin, plain, is its batch's last row to finish)."""
        return 0 if self.mode is DecodingMode.NONE or self.do_sample else self.baseline_every

    def is_lossless_sample(self, seq: int) -> bool:
        """Whether the item at ``seq`` is also decoded without drafts, to check the job's output."""
        every = self.lossless_every
        return every > 0 and (seq + 1) % every == 0
