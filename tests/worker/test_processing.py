"""Per-job stats, the A/B baseline, the speedup guard and draft checks, through the real task code
(embedded mode: Celery eager on SQLite)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_jsonl
from model_factory import build_model, build_tokenizer
from sqlalchemy import func, select

from genjob.cli import main
from genjob.db import session_scope
from genjob.settings import get_settings
from genjob.tables import Job, Result

PROMPTS = ["def foo(x):", "import os", "class A:", "for i in range(3):", "return", "while True:"]


def submit(tmp_path: Path, *args: str) -> str:
    write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": p}) for p in PROMPTS])
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--max-new-tokens", "12", *args])
    assert result.exit_code == 0, result.output
    return result.output.strip()


@pytest.fixture
def no_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timing noise on tiny models must not switch these jobs to plain decoding midway."""
    monkeypatch.setenv("GENJOB_GUARD_THRESHOLD", "0")
    get_settings.cache_clear()


@pytest.fixture(scope="module")
def bad_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A cheap target and a draft that costs many times more and (random, untied) never agrees."""
    directory = tmp_path_factory.mktemp("bad-pair")
    tokenizer = build_tokenizer()
    paths = []
    for name, layers, width in (("target", 1, 32), ("draft", 6, 128)):
        build_model(tokenizer, n_layer=layers, n_embd=width, seed=3).save_pretrained(directory / name)
        tokenizer.save_pretrained(directory / name)
        paths.append(directory / name)
    return paths[0], paths[1]


def test_job_aggregates_are_the_sums_of_its_items(
    embedded_env: str, no_guard: None, tiny_pair, tmp_path: Path
) -> None:
    target, draft = tiny_pair
    job_id = submit(tmp_path, "-m", str(target), "-a", str(draft), "--baseline-fraction", "0.5")
    with session_scope(embedded_env) as session:
        job = session.get(Job, job_id)
        sums = session.execute(
            select(
                func.sum(Result.new_tokens),
                func.sum(Result.target_rounds),
                func.sum(Result.draft_proposed),
                func.sum(Result.draft_accepted),
                func.count(Result.baseline_latency_s),
                func.sum(Result.baseline_latency_s),
            ).where(Result.job_id == job_id)
        ).one()
        assert (job.new_tokens, job.target_rounds, job.draft_proposed, job.draft_accepted) == tuple(sums[:4])
        assert job.baseline_items == sums[4] == 3  # items 0, 2, 4
        assert job.baseline_seconds == pytest.approx(sums[5])
        assert job.baseline_matches == 3  # greedy fp32: lossless
        assert job.cost_ratio is not None and job.cost_ratio > 0
        assert job.draft_tokens is not None
        rows = session.scalars(select(Result).where(Result.job_id == job_id)).all()
        assert all(r.target_rounds + r.draft_accepted == r.new_tokens for r in rows)
        assert all(r.draft_accepted <= r.draft_proposed for r in rows)
    lines = CliRunner().invoke(main, ["stats", job_id]).output.splitlines()
    assert "lossless rate:           100.0%" in lines
    assert any(line.startswith("measured speedup:") and "(A/B on 3 items)" in line for line in lines)


def test_speedup_guard_switches_a_bad_draft_to_plain_decoding(embedded_env: str, bad_pair, tmp_path) -> None:
    target, draft = bad_pair
    job_id = submit(
        tmp_path, "-m", str(target), "-a", str(draft), "--baseline-fraction", "1", "--chunk-size", "2"
    )
    with session_scope(embedded_env) as session:
        job = session.get(Job, job_id)
        assert job.status == "completed" and job.done == len(PROMPTS)
        assert job.guard_tripped
        assert job.guard_reason.startswith("measured speedup 0.")
        assert "on the first 2 sampled items" in job.guard_reason
        modes = [
            r.mode
            for r in session.scalars(select(Result).where(Result.job_id == job_id).order_by(Result.item_id))
        ]
        assert modes[:2] == ["draft", "draft"] and set(modes[2:]) == {"none"}
    stats = CliRunner().invoke(main, ["stats", job_id]).output
    assert "speedup guard:           tripped: measured speedup 0." in stats


def test_a_draft_with_another_vocabulary_is_refused(embedded_env: str, tiny_pair, tmp_path: Path) -> None:
    target, _ = tiny_pair
    other = tmp_path / "other-draft"
    tokenizer = build_tokenizer(vocab_size=300)
    build_model(tokenizer, n_layer=1, n_embd=32, seed=4).save_pretrained(other)
    tokenizer.save_pretrained(other)
    job_id = submit(tmp_path, "-m", str(target), "-a", str(other))
    with session_scope(embedded_env) as session:
        job = session.get(Job, job_id)
        assert job.status == "failed" and job.failed == len(PROMPTS)
        assert "does not share the tokenizer" in job.error


def test_prompt_lookup_job(embedded_env: str, no_guard: None, tiny_pair, tmp_path: Path) -> None:
    target, _ = tiny_pair
    job_id = submit(tmp_path, "-m", str(target), "--mode", "prompt-lookup", "--baseline-fraction", "1")
    with session_scope(embedded_env) as session:
        job = session.get(Job, job_id)
        assert job.status == "completed" and job.cost_ratio == 0.0
        assert job.baseline_items == job.baseline_matches == len(PROMPTS)
