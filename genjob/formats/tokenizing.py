"""What submit needs of the target's tokenizer, as a small interface the CLI and the API hand in.

The core never loads a tokenizer (that would pull transformers into it): the CLI and the API pass an
object with these two methods (``genjob.api.prompt_tokenizer.PromptTokenizer``), tests a fake.
"""

from __future__ import annotations

from typing import Protocol


class SubmitTokenizer(Protocol):
    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt text of chat messages; raises ValueError (with a message for the user) if it cannot."""
        ...

    def context_problem(self, prompt: str, max_new_tokens: int) -> str | None:
        """Why the prompt plus ``max_new_tokens`` does not fit the model's context, or None."""
        ...
