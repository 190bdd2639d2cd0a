"""Per-job stats, probe rounds, the lossless check and draft checks, through the real task code
(embedded mode: Celery eager on SQLite)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import func, select

from genjob.cli import main
from genjob.db import session_scope
from genjob.stats import by_rows
from genjob.tables import Item, Job, Result
from tests.support.models import build_model, build_tokenizer
from tests.support.prompts import write_jsonl

PROMPTS = ["def foo(x):", "import os", "class A:", "for i in range(3):", "return", "while True:"]


def submit(tmp_path: Path, *args: str) -> str:
    write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": p}) for p in PROMPTS])
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--max-new-tokens", "12", *args])
    assert result.exit_code in (0, 3), result.output  # 3: the job ended with failed items
    return result.stdout.strip()


def test_job_aggregates_are_the_sums_of_its_items(embedded_env: str, tiny_pair, tmp_path: Path) -> None:
    target, draft = tiny_pair
    job_id = submit(
        tmp_path, "-m", str(target), "-a", str(draft), "--baseline-fraction", "0.5", "--batch-size", "3"
    )
    with session_scope(embedded_env) as session:
        job = session.get_one(Job, job_id)
        sums = session.execute(
            select(
                func.sum(Result.new_tokens),
                func.sum(Result.target_rounds),
                func.sum(Result.draft_proposed),
                func.sum(Result.draft_accepted),
                func.sum(Result.draft_rejections),
                func.count(Result.lossless_match),
            ).where(Result.job_id == job_id)
        ).one()
        assert (
            job.new_tokens,
            job.target_rounds,
            job.draft_proposed,
            job.draft_accepted,
            job.draft_rejections,
        ) == tuple(sums[:5])
        assert job.lossless_checked == sums[5] == 3  # items 1, 3, 5 also decoded without drafts
        assert job.lossless_matches == 3  # greedy fp32: lossless
        assert job.probe_rounds > 0 and job.probe_tokens > 0 and job.busy_seconds > job.decode_seconds > 0
        assert job.decode_tokens > job.new_tokens - len(PROMPTS)  # and the twins' tokens, but prefills'
        assert sum(job.gamma_hist.values()) == job.decode_rounds - job.probe_rounds
        by_b = by_rows(job.rounds_by_rows)  # rounds by row count: what the measured speedup compares
        assert sum(r["rounds"] for r in by_b.values()) == job.decode_rounds and max(by_b) <= 3
        assert sum(r.get("plain_rounds", 0) for r in by_b.values()) >= job.probe_rounds
        assert sum(r["tokens"] for r in by_b.values()) < job.decode_tokens  # the twins' are no output
        assert 0 < sum(job.drafts_hist.values()) <= job.decode_rows  # row-rounds, probes' rows not counted
        assert max(int(m) for m in job.drafts_hist) <= max(int(k) for k in job.gamma_hist)
        assert job.cost_ratio is not None and job.cost_ratio > 0
        assert job.expected_speedup is not None and job.costs["at_batch"]["plain_ms"] > 0
        rows = session.scalars(select(Result).where(Result.job_id == job_id)).all()
        assert all(r.target_rounds + r.draft_accepted == r.new_tokens for r in rows)
        assert all(r.draft_accepted <= r.draft_proposed for r in rows)
    lines = CliRunner().invoke(main, ["stats", job_id]).output.splitlines()
    assert "lossless rate:           100.0%  (3/3 items)" in lines
    assert any(line.startswith("measured speedup:") and "plain probe rounds" in line for line in lines)
    assert any(line.startswith("per-token α:") for line in lines)


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


def test_prompt_lookup_job(embedded_env: str, tiny_pair, tmp_path: Path) -> None:
    target, _ = tiny_pair
    job_id = submit(tmp_path, "-m", str(target), "--mode", "prompt-lookup", "--baseline-fraction", "1")
    with session_scope(embedded_env) as session:
        job = session.get_one(Job, job_id)
        assert job.status == "completed"
        assert job.lossless_checked == job.lossless_matches == len(PROMPTS)


def test_the_lossless_check_costs_a_short_job_at_most_its_fraction(
    embedded_env: str, tiny_pair, tmp_path: Path
) -> None:
    """1 item in 1/F is checked, the last of each run: a 6-item job at F = 0.25 has its item 3 checked
    (not its first as well), and at the default F = 0.05 none, which `genjob stats` says."""
    target, _ = tiny_pair
    quarter = submit(tmp_path, "-m", str(target), "--mode", "prompt-lookup", "--baseline-fraction", "0.25")
    default = submit(tmp_path, "-m", str(target), "--mode", "prompt-lookup")
    with session_scope(embedded_env) as session:
        checked = session.scalars(
            select(Item.seq)
            .join(Result, Result.item_id == Item.id)
            .where(Result.job_id == quarter, Result.lossless_match.is_not(None))
        ).all()
        assert checked == [3]
        assert session.get_one(Job, default).lossless_checked == 0
    lines = CliRunner().invoke(main, ["stats", default]).output.splitlines()
    assert "lossless rate:           -  (no item checked: 1 in 20 is, and the job has 6)" in lines


def test_auto_job_counts_what_each_proposer_drafted(embedded_env: str, tiny_pair, tmp_path: Path) -> None:
    """Mode auto with the job's draft: rows draft from prompt lookup, the job's suffix cache or the
    draft model; per item and per job the counts add up, `genjob stats` shows them, rows stay lossless."""
    target, draft = tiny_pair
    args = ("-m", str(target), "-a", str(draft), "--mode", "auto", "--baseline-fraction", "0.5")
    job_id = submit(tmp_path, *args, "--batch-size", "3", "--schedule", "constant", "--draft-tokens", "3")
    with session_scope(embedded_env) as session:
        job = session.get_one(Job, job_id)
        assert job.status == "completed" and job.mode == "auto"
        assert job.lossless_checked == job.lossless_matches == 3  # items 1, 3, 5 decoded plainly too
        rows = session.scalars(select(Result).where(Result.job_id == job_id)).all()
        summed: dict[str, int] = {}
        for row in rows:
            for key, n in (row.proposer_counts or {}).items():
                summed[key] = summed.get(key, 0) + n
        assert summed and job.proposer_counts == summed
        names = {key.split(":")[0] for key in summed}
        assert names <= {"prompt-lookup", "suffix", "draft"}
        assert sum(summed[f"{name}:accepted"] for name in names) == job.draft_accepted
    lines = CliRunner().invoke(main, ["stats", job_id]).output.splitlines()
    assert "by proposer:" in lines
