"""OpenAI batch lines: parsed with line-numbered errors, chat messages rendered with the chat template,
results written back as OpenAI batch output; the CLI's --input-format / --format openai."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from tokenizers import processors

from genjob.api.prompt_tokenizer import ChatTemplateError, PromptTokenizer
from genjob.cli import main
from genjob.constants import InputFormat
from genjob.formats.lines import InputFileError, InputLimits, LineError
from genjob.formats.openai_output import response_record
from genjob.formats.reader import first_line_model
from genjob.tables import Item, Job, Result
from tests.support.models import EOS, build_tokenizer, with_chat_template
from tests.support.prompts import FakeTokenizer, iter_prompt_file, validate_prompt_file, write_jsonl

OPENAI = {"limits": InputLimits(), "input_format": InputFormat.OPENAI}


def errors_of(tmp_path: Path, lines: list[str], **kwargs) -> list[str]:
    path = write_jsonl(tmp_path / "p.jsonl", lines)
    with pytest.raises(InputFileError) as info:
        validate_prompt_file(path, **{**OPENAI, **kwargs})
    return [error.format("p.jsonl") for error in info.value.errors]


CASES = [
    (
        "unknown_body_field",
        {"body": {"prompt": "x", "tools": []}},
        "p.jsonl:1: unknown field 'body.tools' "
        "(allowed: model, prompt, messages, max_tokens, max_completion_tokens, temperature, top_p, seed, "
        "stop, n, stream, user, metadata)",
    ),
    ("n_above_one", {"body": {"prompt": "x", "n": 2}}, "p.jsonl:1: field 'body.n': Input should be 1"),
    (
        "streaming",
        {"body": {"prompt": "x", "stream": True}},
        "p.jsonl:1: field 'body.stream': Input should be False",
    ),
    (
        "temperature_out_of_range",
        {"body": {"prompt": "x", "temperature": 2.5}},
        "p.jsonl:1: field 'body.temperature': Input should be less than or equal to 2",
    ),
    (
        "five_stop_strings",
        {"body": {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}},
        "p.jsonl:1: field 'body.stop': at most 4 stop strings",
    ),
    (
        "unknown_top_level_field",
        {"custom_id": "a", "body": {"prompt": "x"}, "id": 3},
        "p.jsonl:1: unknown field 'id' (allowed: custom_id, method, url, body)",
    ),
    ("missing_body", {"custom_id": "a"}, "p.jsonl:1: missing required field 'body'"),
    (
        "prompt_and_messages",
        {"body": {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}},
        "p.jsonl:1: field 'body': give exactly one of 'prompt' (/v1/completions) "
        "or 'messages' (/v1/chat/completions)",
    ),
    (
        "url_does_not_match_body",
        {"url": "/v1/completions", "body": {"messages": [{"role": "user", "content": "y"}]}},
        "p.jsonl:1: url /v1/completions takes a body with 'prompt'",
    ),
    (
        "unknown_url",
        {"url": "/v1/embeddings", "body": {"prompt": "x"}},
        "p.jsonl:1: field 'url': Input should be '/v1/completions' or '/v1/chat/completions'",
    ),
    (
        "bad_role",
        {"body": {"messages": [{"role": "robot", "content": "y"}]}},
        "p.jsonl:1: field 'body.messages.0.role': "
        "Input should be 'system', 'developer', 'user' or 'assistant'",
    ),
    (
        "unknown_message_field",
        {"body": {"messages": [{"role": "user", "content": "y", "tool_calls": []}]}},
        "p.jsonl:1: unknown field 'body.messages.0.tool_calls' (allowed: role, content, name)",
    ),
    (
        "image_part",
        {"body": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}]}},
        "p.jsonl:1: field 'body.messages.0.content': must be a string or a list of "
        '{"type": "text", "text": "..."} parts',
    ),
    (
        "max_tokens_zero",
        {"body": {"prompt": "x", "max_tokens": 0}},
        "p.jsonl:1: field 'body.max_tokens': must be between 1 and 8192, got 0",
    ),
    (
        "max_completion_tokens_too_big",
        {"body": {"messages": [{"role": "user", "content": "y"}], "max_completion_tokens": 10**6}},
        "p.jsonl:1: field 'body.max_completion_tokens': must be between 1 and 8192, got 1000000",
    ),
    ("blank_prompt", {"body": {"prompt": "  "}}, "p.jsonl:1: field 'body.prompt': must not be blank"),
    (
        "nul_in_prompt",
        {"body": {"prompt": "a\u0000b"}},
        "p.jsonl:1: field 'body.prompt': must not contain NUL characters (\\u0000)",
    ),
]


@pytest.mark.parametrize(("line", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request_lines(tmp_path: Path, line: dict, expected: str) -> None:
    assert errors_of(tmp_path, [json.dumps(line)], tokenizer=FakeTokenizer(lambda messages: "rendered")) == [
        expected
    ]


def test_duplicate_custom_id_and_one_endpoint_per_file(tmp_path: Path) -> None:
    lines = [
        json.dumps({"custom_id": "a", "body": {"prompt": "x"}}),
        json.dumps({"custom_id": "a", "body": {"prompt": "y"}}),
        json.dumps({"custom_id": "b", "body": {"messages": [{"role": "user", "content": "z"}]}}),
    ]
    assert errors_of(tmp_path, lines, tokenizer=FakeTokenizer(lambda messages: "rendered")) == [
        "p.jsonl:2: field 'custom_id': duplicate id 'a'",
        "p.jsonl:3: a /v1/chat/completions request in a file of /v1/completions requests (line 1): "
        "a batch uses one endpoint",
    ]


def test_storable_text_in_genjob_lines_too(tmp_path: Path) -> None:
    lines = ['{"prompt": "a\\u0000"}', '{"prompt": "b", "id": "\\ud800"}']
    path = write_jsonl(tmp_path / "p.jsonl", lines)
    with pytest.raises(InputFileError) as info:
        validate_prompt_file(path, limits=InputLimits())
    assert [e.format("p.jsonl") for e in info.value.errors] == [
        "p.jsonl:1: field 'prompt': must not contain NUL characters (\\u0000)",
        "p.jsonl:2: field 'id': Input should be a valid string, unable to parse raw data as a unicode string",
    ]


def test_prompt_lines_become_items(tmp_path: Path) -> None:
    lines = [
        json.dumps(
            {
                "custom_id": "r1",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "m", "prompt": "a"},
            }
        ),
        "",
        json.dumps({"custom_id": "r2", "body": {"prompt": "b", "max_tokens": 7}}),
    ]
    path = write_jsonl(tmp_path / "p.jsonl", lines)
    assert validate_prompt_file(path, **OPENAI) == 2
    items = list(iter_prompt_file(path, **OPENAI))
    assert [(i.seq, i.line, i.prompt, i.custom_id, i.max_new_tokens, i.endpoint) for i in items] == [
        (0, 1, "a", "r1", None, "/v1/completions"),
        (1, 3, "b", "r2", 7, "/v1/completions"),
    ]


def test_messages_need_a_renderer(tmp_path: Path) -> None:
    line = json.dumps({"body": {"messages": [{"role": "user", "content": "y"}]}})
    assert errors_of(tmp_path, [line]) == [
        "p.jsonl:1: messages need a chat template, and none is available here"
    ]


@pytest.fixture(scope="module")
def bos_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer that adds BOS itself on encoding, with a chat template that also starts with BOS."""
    tokenizer = build_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{EOS} $A", special_tokens=[(EOS, eos_id)]
    )
    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    )
    directory = tmp_path_factory.mktemp("bos") / "tok"
    tokenizer.save_pretrained(directory)
    return directory


def test_chat_template_gives_the_ids_of_apply_chat_template(bos_tokenizer_dir: Path) -> None:
    from genjob.generation.loading import load_tokenizer

    messages = [{"role": "user", "content": "def foo(x):"}]
    text = PromptTokenizer(str(bos_tokenizer_dir)).render_chat(messages)
    assert text == "[user] def foo(x):\n"  # the template's BOS dropped: encoding adds it back
    tokenizer = load_tokenizer(str(bos_tokenizer_dir))
    expected = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert tokenizer(text)["input_ids"] == list(expected)


def test_chat_template_errors(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(ChatTemplateError, match="has no chat template: send 'prompt' lines"):
        PromptTokenizer(str(tiny_pair[0])).render_chat([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="messages need the target's tokenizer: cannot load"):
        PromptTokenizer(str(tmp_path / "missing")).render_chat([{"role": "user", "content": "x"}])
    strict = with_chat_template(
        tiny_pair[0], tmp_path / "strict", "{{ raise_exception('only user messages') }}"
    )
    with pytest.raises(ChatTemplateError, match="the chat template refused the messages: only user messages"):
        PromptTokenizer(str(strict)).render_chat([{"role": "user", "content": "x"}])


def test_response_records() -> None:
    created = datetime(2025, 1, 2, tzinfo=UTC)
    job = Job(id="abc", model="/m/t", spec={"endpoint": "/v1/chat/completions"})
    done = Item(seq=0, custom_id="r1", status="done")
    result = Result(
        output="hi",
        finish_reason="stop",
        mode="draft",
        prompt_tokens=4,
        new_tokens=2,
        target_rounds=2,
        draft_proposed=5,
        draft_accepted=3,
        draft_rejections=1,
        gamma_mean=2.5,
        latency_s=0.25,
        looping=False,
        created_at=created,
    )
    assert response_record(job, done, result) == {
        "id": "batch_req_abc_0",
        "custom_id": "r1",
        "response": {
            "status_code": 200,
            "request_id": "abc-0",
            "body": {
                "id": "chatcmpl-abc-0",
                "object": "chat.completion",
                "created": int(created.timestamp()),
                "model": "t",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hi"},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": 4,
                    "completion_tokens": 2,
                    "total_tokens": 6,
                    "completion_tokens_details": {
                        "accepted_prediction_tokens": 3,
                        "rejected_prediction_tokens": 2,
                    },
                },
                "genjob": {
                    "mode": "draft",
                    "target_rounds": 2,
                    "draft_proposed": 5,
                    "draft_accepted": 3,
                    "draft_rejections": 1,
                    "gamma_mean": 2.5,
                    "latency_s": 0.25,
                    "looping": False,
                },
            },
        },
        "error": None,
    }
    failed = Item(seq=1, custom_id=None, status="failed", error="PromptTooLong: too long")
    assert response_record(job, failed, None) == {
        "id": "batch_req_abc_1",
        "custom_id": None,
        "response": None,
        "error": {"code": "item_failed", "message": "PromptTooLong: too long"},
    }


def test_cli_submit_openai_lines_and_results_as_openai(
    embedded_env: str, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    target, draft = tiny_pair
    lines = [
        json.dumps({"custom_id": "r1", "body": {"prompt": "def foo(x):", "max_tokens": 4}}),
        json.dumps({"custom_id": "r2", "body": {"prompt": "import os", "max_tokens": 2}}),
    ]
    write_jsonl(tmp_path / "p.jsonl", lines)
    submitted = CliRunner().invoke(
        main, ["submit", "p.jsonl", "-m", str(target), "-a", str(draft), "--input-format", "openai"]
    )
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.output.strip()
    output = CliRunner().invoke(main, ["results", job_id, "--format", "openai"]).output
    records = [json.loads(line) for line in output.splitlines()]
    assert [r["custom_id"] for r in records] == ["r1", "r2"]
    assert [r["response"]["body"]["usage"]["completion_tokens"] for r in records] == [4, 2]
    assert {r["response"]["body"]["object"] for r in records} == {"text_completion"}


def test_cli_reports_openai_line_errors(embedded_env: str, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "p.jsonl", [json.dumps({"body": {"prompt": "x", "n": 2}})])
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "-m", "m", "--input-format", "openai"])
    assert result.exit_code == 1
    assert result.output == "Error: p.jsonl:1: field 'body.n': Input should be 1\n"


def test_the_batch_model_check_reports_a_line_that_does_not_parse_as_the_full_check_does() -> None:
    """A first line nested 70 deep that does name a model: the Batches API said it named no model."""
    deep = '{"custom_id": "x", "body": {"model": "tiny", "x": ' + "[" * 70 + "]" * 70 + "}}\n"
    stream = io.BytesIO(b"\n" + deep.encode())
    found = first_line_model(stream, limits=InputLimits())
    assert found == (2, LineError(2, "invalid JSON: arrays or objects nested deeper than 64 levels"))
    assert stream.tell() == 0
