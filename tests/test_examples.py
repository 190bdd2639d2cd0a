"""The example jobs examples/<task>.jsonl (scripts/build_examples.py, bench/task_prompts.py): genjob's
own reader takes them as OpenAI lines, they are what the script builds, and the benchmarks' held-out
prompts share nothing with them. No model: the chat template is a stand-in."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from genjob.constants import InputFormat, OpenAIEndpoint
from genjob.formats.openai_lines import RequestLine, parse_openai_line
from genjob.formats.reader import LineChecks, check_prompts
from tests.support.prompts import FakeTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import task_prompts  # noqa: E402  (bench/task_prompts.py)

HELDOUT_N = 64  # more than bench/tasks.py takes by default (16)


def load_build_examples() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_examples", ROOT / "scripts" / "build_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chatml(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def example_lines(task: str) -> list[dict[str, Any]]:
    path = ROOT / "examples" / f"{task}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("task", task_prompts.TASKS)
def test_example_file_is_valid_openai_batch_input(task: str) -> None:
    path = ROOT / "examples" / f"{task}.jsonl"
    with path.open("rb") as stream:  # the whole file as genjob submit and the Batches API read it
        checks = LineChecks(
            input_format=InputFormat.OPENAI,
            tokenizer=FakeTokenizer(chatml),
            model="smollm2",
            endpoint=OpenAIEndpoint.CHAT_COMPLETIONS,
        )
        summary = check_prompts(stream, checks, source=str(path))
    lines = example_lines(task)
    assert summary.count == len(lines) == (24 if task == "classify" else 16)
    ids = [line["custom_id"] for line in lines]
    assert len(set(ids)) == len(ids)
    for line in lines:
        parsed = parse_openai_line(line, FakeTokenizer(chatml))
        assert parsed.custom_id is not None and parsed.custom_id.startswith(f"{task}-")
        assert len(parsed.custom_id) <= task_prompts.MAX_ID_CHARS
        assert parsed.max_new_tokens == task_prompts.MAX_TOKENS[task]
        assert parsed.sampling is not None and parsed.sampling.temperature == 0
        body = RequestLine.model_validate(line).body
        assert body.messages is not None and body.messages[-1].role == "user"
        assert (
            task_prompts.estimate_tokens(chatml(line["body"]["messages"])) <= task_prompts.MAX_PROMPT_TOKENS
        )


def test_examples_are_what_the_script_builds() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_examples.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr  # the installed versions are the pinned ones


def test_reading_packages_imports_none_of_them() -> None:
    packages = (*task_prompts.EXAMPLE_PACKAGES, *task_prompts.HELDOUT_PACKAGES)
    code = (
        "import sys, task_prompts\n"
        f"for task in task_prompts.TASKS: task_prompts.chat_lines(task, {packages!r}, 8)\n"
        f"print(sorted(set(sys.modules) & {{*{packages!r}, 'torch', 'genjob'}}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT / "bench", capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_example_and_heldout_packages_are_disjoint() -> None:
    assert not set(task_prompts.EXAMPLE_PACKAGES) & set(task_prompts.HELDOUT_PACKAGES)


@pytest.mark.parametrize("task", task_prompts.TASKS)
def test_heldout_prompts_share_nothing_with_the_examples(task: str) -> None:
    examples = example_lines(task)
    example_texts = [
        text.text for text in task_prompts.pick_texts(task, task_prompts.EXAMPLE_PACKAGES, len(examples))
    ]
    heldout = task_prompts.pick_texts(task, task_prompts.HELDOUT_PACKAGES, HELDOUT_N)
    assert len(heldout) == HELDOUT_N
    heldout_ids = {task_prompts.custom_id(task, text.key) for text in heldout}
    assert not heldout_ids & {line["custom_id"] for line in examples}
    for text in heldout:
        assert not any(text.text in other or other in text.text for other in example_texts), text.key
    # nor could any other pick: no text of a held-out package is a text of an example package
    pools = [
        {text.text for package in packages for text in task_prompts.candidates(task, package)}
        for packages in (task_prompts.EXAMPLE_PACKAGES, task_prompts.HELDOUT_PACKAGES)
    ]
    assert not pools[0] & pools[1]


def test_readme_names_the_pinned_versions() -> None:
    readme = (ROOT / "examples" / "README.md").read_text(encoding="utf-8").lower()
    packages = (*task_prompts.EXAMPLE_PACKAGES, *task_prompts.HELDOUT_PACKAGES)
    for package, (distribution, _, pinned) in load_build_examples().package_versions(packages).items():
        assert pinned is not None, f"{package} is not pinned in constraints.txt"
        assert f"{distribution} {pinned}".lower() in readme, package
    for task in task_prompts.TASKS:
        assert f"`{task}.jsonl`" in readme
