"""The whole pipeline on real services: CLI submit → Postgres → Redis → a real `celery worker`
subprocess → assisted generation → result tables → CLI results."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from genjob.db import session_scope
from genjob.generation.loading import load_model, load_tokenizer
from genjob.tables import Item, Job, Result
from tests.support.engine import Reference
from tests.support.processes import GENJOB, run_cli, service_env
from tests.support.prompts import write_jsonl

pytestmark = pytest.mark.integration

PROMPT_STEMS = ["def ", "import ", "class ", "return ", "for x in ", "if not ", "while ", "    self."]


def test_fifty_items_through_a_real_worker(
    pg_url: str, queue_name: str, tiny_pair: tuple[Path, Path], tmp_path: Path, start_worker
) -> None:
    target, draft = tiny_pair
    prompts = [f"{PROMPT_STEMS[i % len(PROMPT_STEMS)]}item_{i}" for i in range(50)]
    lines = [
        json.dumps({"prompt": p, "id": f"q{i:02d}", "max_new_tokens": 8 + i % 9})
        for i, p in enumerate(prompts)
    ]
    path = write_jsonl(tmp_path / "prompts.jsonl", lines)
    env = service_env(pg_url, queue_name)
    start_worker(queue_name, env, genjob=[GENJOB])

    submitted = run_cli(
        env,
        "submit",
        str(path),
        "-m",
        str(target),
        "-a",
        str(draft),
        "--chunk-size",
        "7",
        "--wait",
        timeout=300,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert "completed: 50 done, 0 failed of 50" in submitted.stderr

    exported = run_cli(env, "results", job_id, timeout=60, check=True)
    records = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [r["id"] for r in records] == [f"q{i:02d}" for i in range(50)]
    assert all(r["status"] == "done" for r in records)
    assert all(r["target_rounds"] + r["draft_accepted"] == r["new_tokens"] for r in records)

    with session_scope(pg_url) as session:
        job = session.get(Job, job_id)
        assert (job.status, job.total, job.done, job.failed) == ("completed", 50, 50, 0)
        assert job.started_at is not None and job.finished_at >= job.started_at
        rows = session.query(Result).filter_by(job_id=job_id).all()
        assert len(rows) == 50
        assert job.new_tokens == sum(r.new_tokens for r in rows)
        assert job.draft_accepted == sum(r.draft_accepted for r in rows)
        assert {r.worker for r in rows} == {f"{queue_name}@{os.uname().nodename}"}
        assert session.query(Item).filter_by(job_id=job_id, attempts=1).count() == 50

    # Lossless: every output is the target's own plain greedy output (transformers' generate, the oracle).
    tokenizer = load_tokenizer(str(target))
    reference = Reference(load_model(str(target)))
    for record, prompt in zip(records, prompts, strict=True):
        plain = reference(tokenizer(prompt)["input_ids"], record["new_tokens"], tokenizer.eos_token_id)
        assert record["output"] == tokenizer.decode(plain, skip_special_tokens=True), record["id"]


def test_status_and_cancel_through_the_cli(pg_url: str, queue_name: str, tmp_path: Path) -> None:
    """No worker listens: the job stays queued until cancelled; its items are cancelled too."""
    env = service_env(pg_url, queue_name)
    path = write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": f"p{i}"}) for i in range(3)])
    submitted = run_cli(
        env, "submit", str(path), "-m", "some/model", "--mode", "none", timeout=60, check=True
    )
    job_id = submitted.stdout.strip()
    cancel = run_cli(env, "cancel", job_id, timeout=60)
    assert cancel.stdout == f"cancelled {job_id}\n"
    again = run_cli(env, "cancel", job_id, timeout=60)
    assert again.returncode == 1 and again.stderr == f"Error: job {job_id} already ended (cancelled)\n"
    with session_scope(pg_url) as session:
        assert {i.status for i in session.query(Item).filter_by(job_id=job_id)} == {"cancelled"}
