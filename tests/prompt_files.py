"""Test helpers reading a prompt file whole through the one reader (``genjob.formats.reader``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from genjob.constants import InputFormat
from genjob.formats.lines import InputLimits, PromptItem, check_file_size
from genjob.formats.reader import check_prompts, valid_prompts


class FakeTokenizer:
    """A ``SubmitTokenizer`` whose chat rendering is ``render`` and whose context is unlimited."""

    def __init__(self, render: Callable[[list[dict[str, str]]], str]) -> None:
        self.render = render

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return self.render(messages)

    def context_problem(self, prompt: str, max_new_tokens: int) -> str | None:
        return None


def validate_prompt_file(
    path: Path, *, limits: InputLimits, input_format: InputFormat = InputFormat.GENJOB, **kwargs: Any
) -> int:
    check_file_size(path, limits=limits)
    with path.open("rb") as stream:
        return check_prompts(
            stream, source=str(path), limits=limits, input_format=input_format, **kwargs
        ).count


def iter_prompt_file(
    path: Path, *, limits: InputLimits, input_format: InputFormat = InputFormat.GENJOB, **kwargs: Any
) -> Iterator[PromptItem]:
    with path.open("rb") as stream:
        yield from valid_prompts(stream, source=str(path), limits=limits, input_format=input_format, **kwargs)
