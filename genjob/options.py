"""What a job asks the workers to do: model names and decoding options, stored on the job row."""

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from genjob.constants import DecodingMode, DraftSchedule, OpenAIEndpoint


class JobSpec(BaseModel):
    """Generation options for every item of a job (an item may override ``max_new_tokens``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, max_length=500, description="Target model: hub id or local path.")
    assistant: str | None = Field(
        default=None, min_length=1, max_length=500, description="Draft model for mode 'draft'."
    )
    mode: DecodingMode = DecodingMode.DRAFT
    max_new_tokens: int = Field(default=128, ge=1)
    draft_tokens: int = Field(default=5, ge=1, le=64, description="γ: tokens the draft proposes a round.")
    schedule: DraftSchedule = DraftSchedule.HEURISTIC
    prompt_lookup_tokens: int = Field(default=10, ge=1, le=64)
    temperature: float = Field(default=0.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    batch_size: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="Prompts decoded together per forward pass (greedy draft/none modes); "
        "unset: GENJOB_BATCH_SIZE or a probe of the device; 1: one prompt at a time.",
    )
    baseline_fraction: float = Field(
        default=0.05, ge=0.0, le=1.0, description="Share of items also decoded plainly to measure speedup."
    )
    endpoint: OpenAIEndpoint | None = Field(
        default=None,
        description="OpenAI batch endpoint of the input lines (None: genjob lines); shapes openai output.",
    )

    @model_validator(mode="after")
    def _assistant_matches_mode(self) -> Self:
        if self.mode is DecodingMode.DRAFT and not self.assistant:
            raise ValueError("mode 'draft' needs an assistant (draft) model")
        if self.mode is not DecodingMode.DRAFT and self.assistant:
            raise ValueError(f"mode '{self.mode}' takes no assistant model")
        return self

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0
