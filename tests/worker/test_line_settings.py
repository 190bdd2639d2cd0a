"""A line's own settings (OpenAI request lines) travel from its item row to the engine's Request: stop
strings end the output before them, a seed gives the same draws wherever the line sits, an omitted
temperature takes the job's."""

from __future__ import annotations

import json
from pathlib import Path

from genjob import store
from genjob.constants import InputFormat
from genjob.db import session_scope
from genjob.generation.stopping import cut_at_stop
from genjob.options import JobSpec
from genjob.settings import Settings
from genjob.submit import input_limits
from genjob.worker import chunks
from tests.support.prompts import iter_prompt_file, write_jsonl

PROMPT = "def fibonacci(n):"


def openai_lines(path: Path, bodies: list[dict]) -> Path:
    lines = [
        json.dumps({"custom_id": f"r{i}", "body": {"prompt": PROMPT, **body}})
        for i, body in enumerate(bodies)
    ]
    return write_jsonl(path, lines)


def run_openai(settings: Settings, path: Path, spec: JobSpec) -> list[dict]:
    """Store the lines as a job, run its one chunk here through the worker's code; each item's result."""
    with session_scope(settings.database_url) as session:
        items = iter_prompt_file(path, limits=input_limits(settings), input_format=InputFormat.OPENAI)
        job_id = store.create_job(session, spec=spec, items=items, queue=settings.queue).id
    with session_scope(settings.database_url) as session:
        (item_ids,) = store.pending_item_chunks(session, job_id=job_id, chunk_size=100)
    chunks.process_chunk(settings=settings, job_id=job_id, item_ids=item_ids, worker="test-worker")
    with session_scope(settings.database_url) as session:
        return [
            {"output": r.output, "finish_reason": r.finish_reason, "new_tokens": r.new_tokens}
            for _, r in store.iter_results(session, job_id=job_id)
            if r is not None
        ]


def test_stop_strings_seeds_and_temperatures(
    pg_url: str, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    target, _ = tiny_pair
    settings = Settings(database_url=pg_url)
    spec = JobSpec(model=str(target), mode="none", max_new_tokens=12, baseline_fraction=0, batch_size=4)
    (plain,) = run_openai(settings, openai_lines(tmp_path / "a.jsonl", [{}]), spec)
    text = plain["output"]
    assert plain["finish_reason"] == "length" and len(text) > 4
    stop = text[2:4]

    rows = run_openai(
        settings,
        openai_lines(
            tmp_path / "b.jsonl",
            [
                {"stop": stop},
                {"stop": ["never there \x01", stop]},
                {"temperature": 1.0, "seed": 5},
                {"temperature": 1.0, "seed": 5, "top_p": 1.0},
                {"temperature": 0},
                {"stop": "never there \x01"},
            ],
        ),
        spec,
    )
    cut = text[: text.find(stop)]
    assert [(r["output"], r["finish_reason"]) for r in rows[:2]] == [(cut, "stop"), (cut, "stop")]
    assert rows[0]["new_tokens"] < plain["new_tokens"]
    assert rows[2]["output"] == rows[3]["output"]  # one seed, the same draws at any position
    assert rows[4]["output"] == rows[5]["output"] == text  # greedy: the job's temperature 0, or the line's


def test_cut_at_stop() -> None:
    assert cut_at_stop("abc\n\ndef", ["\n\n"]) == "abc"
    assert cut_at_stop("abcdef", ["e", "c"]) == "ab"
    assert cut_at_stop("abcdef", ["x"]) == "abcdef"
    assert cut_at_stop("abcdef", None) == "abcdef"
