"""Prompt files: written as JSONL, and read whole through the one reader (``genjob.formats.reader``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from genjob.constants import InputFormat
from genjob.formats.lines import InputFileError, InputLimits, LineError, PromptItem, file_too_large_message
from genjob.formats.reader import LineChecks, check_prompts, valid_prompts


def write_jsonl(path: Path, lines: Iterable[str]) -> Path:
    """``lines`` as they are, one a line (written as they come: a large file is never held whole)."""
    with path.open("w", encoding="utf-8") as out:
        for line in lines:
            out.write(line + "\n")
    return path


def prompts_file(path: Path, prompts: Iterable[str], *, id_format: str | None = "q{:03d}") -> Path:
    """A genjob prompt file: ``{"prompt": …, "id": id_format.format(i)}`` a line (no ids when None)."""
    lines = (
        {"prompt": prompt} if id_format is None else {"prompt": prompt, "id": id_format.format(i)}
        for i, prompt in enumerate(prompts)
    )
    return write_jsonl(path, (json.dumps(line) for line in lines))


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
    size = path.stat().st_size  # over the limit: refused from its size alone, as a submit does
    if size > limits.max_file_bytes:
        raise InputFileError(
            str(path), [LineError(None, file_too_large_message(size, limits.max_file_bytes))]
        )
    with path.open("rb") as stream:
        checks = LineChecks(limits=limits, input_format=input_format, **kwargs)
        return check_prompts(stream, checks, source=str(path)).count


def iter_prompt_file(
    path: Path, *, limits: InputLimits, input_format: InputFormat = InputFormat.GENJOB, **kwargs: Any
) -> Iterator[PromptItem]:
    with path.open("rb") as stream:
        checks = LineChecks(limits=limits, input_format=input_format, **kwargs)
        yield from valid_prompts(stream, checks, source=str(path))
