"""The one item loop: a chunk goes through the engine in batches and stores what batch size 1 stores;
items are claimed as rows free up; a crashed batch's items finish one at a time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from genjob import store
from genjob.db import session_scope
from genjob.generation import cost_cache
from genjob.generation.engine import Engine
from genjob.generation.loading import load_model
from genjob.options import JobSpec
from genjob.settings import Settings
from genjob.submit import input_limits
from genjob.tables import Attempt, Item, Job, utcnow
from genjob.worker import chunks, leasing, runners
from tests.support.engine import Reference, flat_costs
from tests.support.models import build_model, build_tokenizer
from tests.support.prompts import iter_prompt_file, write_jsonl

PROMPTS = ["def ", "import os\n", "class A:", "for i in range(3):", "x = ", "return ", "while True:", "if a:"]


@pytest.fixture
def batch_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The largest number of rows each engine decoded together (the real engine runs)."""
    calls: dict[int, int] = {}
    real = Engine._round_of_decoding

    def spy(self):
        calls[id(self)] = max(calls.get(id(self), 0), len(self.rows))
        return real(self)

    monkeypatch.setattr(Engine, "_round_of_decoding", spy)

    class Seen(list):
        def __eq__(self, other):
            return list(calls.values()) == other

    return Seen()


def store_one_chunk(settings: Settings, path: Path, spec: JobSpec) -> tuple[str, list[int]]:
    """(job id, its item ids as one chunk). Stored without submit's context check, so a too-long
    prompt reaches the worker, whose own check (PromptTooLong, for models submit cannot read
    locally) must fail it inside the batch."""
    with session_scope(settings.database_url) as session:
        items = iter_prompt_file(path, limits=input_limits(settings))
        job_id = store.create_job(session, spec=spec, items=items, queue=settings.queue).id
    with session_scope(settings.database_url) as session:
        (item_ids,) = store.pending_item_chunks(session, job_id=job_id, chunk_size=100)
    return job_id, item_ids


def run_job(settings: Settings, path: Path, spec: JobSpec) -> tuple[Job, list[dict]]:
    job_id, item_ids = store_one_chunk(settings, path, spec)
    chunks.process_chunk(settings=settings, job_id=job_id, item_ids=item_ids, worker="test-worker")
    with session_scope(settings.database_url) as session:
        job = store.get_job(session, job_id=job_id)
        rows = [
            {"seq": item.seq, "status": item.status, "error": item.error}
            | (
                {}
                if result is None
                else {
                    "output": result.output,
                    "new_tokens": result.new_tokens,
                    "target_rounds": result.target_rounds,
                    "draft_proposed": result.draft_proposed,
                    "draft_accepted": result.draft_accepted,
                    "draft_rejections": result.draft_rejections,
                    "gamma_mean": result.gamma_mean,
                    "latency_s": result.latency_s,
                    "finish_reason": result.finish_reason,
                    "mode": result.mode,
                }
            )
            for item, result in store.iter_results(session, job_id=job_id)
        ]
        session.expunge(job)
    return job, rows


@pytest.mark.parametrize("mode", ["draft", "none"])
def test_a_chunk_of_several_items_is_decoded_in_batches(
    pg_url: str, tiny_pair: tuple[Path, Path], tmp_path: Path, batch_calls: list[int], mode: str
) -> None:
    target, draft = tiny_pair
    lines = [json.dumps({"prompt": p, "max_new_tokens": 3 + 5 * (i % 4)}) for i, p in enumerate(PROMPTS)]
    lines.insert(3, json.dumps({"prompt": "x " * 600}))  # longer than the model's context: fails alone
    path = write_jsonl(tmp_path / "prompts.jsonl", lines)
    settings = Settings(database_url=pg_url)
    spec = {
        "model": str(target),
        "mode": mode,
        "max_new_tokens": 16,
        "draft_tokens": 3,
        "baseline_fraction": 0,
    }
    if mode == "draft":
        spec["assistant"] = str(draft)

    one_job, one = run_job(settings, path, JobSpec(**spec, batch_size=1))
    assert batch_calls == [1]
    batched_job, batched = run_job(settings, path, JobSpec(**spec, batch_size=4))
    assert batch_calls == [1, 4]

    strip = (
        "latency_s",
        "target_rounds",
        "draft_proposed",
        "draft_accepted",
        "draft_rejections",
        "gamma_mean",
    )
    assert [{k: v for k, v in r.items() if k not in strip} for r in batched] == [
        {k: v for k, v in r.items() if k not in strip} for r in one
    ]
    assert batched[3]["status"] == "failed" and "exceeds the model's context" in batched[3]["error"]
    done = [r for r in batched if r["status"] == "done"]
    assert len(done) == len(PROMPTS)
    for row in done:
        assert row["target_rounds"] + row["draft_accepted"] == row["new_tokens"]
        assert row["draft_accepted"] <= row["draft_proposed"]
    assert (batched_job.status, batched_job.done, batched_job.failed) == ("completed", len(PROMPTS), 1)
    assert batched_job.new_tokens == one_job.new_tokens == sum(r["new_tokens"] for r in done)
    assert batched_job.target_rounds == sum(r["target_rounds"] for r in done)
    assert batched_job.draft_accepted == sum(r["draft_accepted"] for r in done)


@pytest.fixture
def dear_draft_costs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The worker's costs given, not timed (a busy machine must not decide a test): a draft step costs
    five verifications."""
    monkeypatch.setattr(cost_cache, "costs_for", lambda *_a, **_k: flat_costs(8, draft_step=5.0))
    cost_cache.measured_costs.cache_clear()
    yield
    cost_cache.measured_costs.cache_clear()


def test_a_draft_that_does_not_pay_leaves_the_job_to_plain_decoding(
    pg_url: str, tmp_path: Path, dear_draft_costs: None
) -> None:
    """A draft that costs many times the target (and never agrees): the worker's costs make k = 0 the
    best choice, so the job decodes (nearly) plainly, outputs unchanged: no switch, no guard."""
    tokenizer = build_tokenizer()
    paths = []
    for name, layers, width in (("target", 1, 32), ("draft", 6, 128)):
        build_model(tokenizer, n_layer=layers, n_embd=width, seed=3).save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        paths.append(str(tmp_path / name))
    lines = [json.dumps({"prompt": p}) for p in PROMPTS]
    path = write_jsonl(tmp_path / "prompts.jsonl", lines)
    spec = JobSpec(
        model=paths[0], assistant=paths[1], mode="draft", max_new_tokens=24, batch_size=3, baseline_fraction=0
    )
    job, rows = run_job(Settings(database_url=pg_url), path, spec)
    hist = {int(k): n for k, n in job.gamma_hist.items()}
    assert hist.get(0, 0) / sum(hist.values()) > 0.6
    assert all(row["status"] == "done" and row["mode"] == "draft" for row in rows)
    reference = Reference(load_model(paths[0]))
    for row, prompt in zip(rows, PROMPTS, strict=True):
        expected = reference(tokenizer(prompt)["input_ids"], 24, tokenizer.eos_token_id)
        assert row["output"] == tokenizer.decode(expected, skip_special_tokens=True)


def test_batch_size_comes_from_the_job_then_the_setting_then_the_device(tiny_pair: tuple[Path, Path]) -> None:
    target, draft = tiny_pair
    spec = JobSpec(model=str(target), assistant=str(draft))
    assert runners.batch_size_for(spec, Settings(batch_size=6)) == 6
    assert runners.batch_size_for(spec.model_copy(update={"batch_size": 3}), Settings(batch_size=6)) == 3
    assert runners.batch_size_for(spec, Settings()) is None
    probed = runners.JobRunner.build(spec, settings=Settings()).batch_size
    assert 1 <= probed <= 64


def draft_spec(tiny_pair: tuple[Path, Path], batch_size: int) -> JobSpec:
    target, draft = tiny_pair
    return JobSpec(
        model=str(target),
        assistant=str(draft),
        mode="draft",
        max_new_tokens=10,
        draft_tokens=3,
        baseline_fraction=0,
        batch_size=batch_size,
    )


def item_states(settings: Settings, job_id: str) -> list[tuple[str, str | None, datetime | None]]:
    with session_scope(settings.database_url) as session:
        rows = session.execute(
            select(Item.status, Item.claimed_by, Item.lease_expires_at).where(Item.job_id == job_id)
        )
        return [tuple(row) for row in rows]


def test_items_are_claimed_as_batch_slots_free_up_and_hold_live_leases(
    pg_url: str, tiny_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never more items running than the batch has slots, each with this worker's live lease."""
    settings = Settings(database_url=pg_url)
    seen: list[list[tuple]] = []
    real = Engine.step

    def watching(self):
        finished = real(self)
        for _ in finished:
            seen.append(item_states(settings, job_id))  # before the worker records this row
        return finished

    monkeypatch.setattr(Engine, "step", watching)
    path = write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": p}) for p in PROMPTS])
    job_id, item_ids = store_one_chunk(settings, path, draft_spec(tiny_pair, 3))
    outcome = chunks.process_chunk(settings=settings, job_id=job_id, item_ids=item_ids, worker="w1")

    assert outcome.done == len(PROMPTS) and len(seen) == len(PROMPTS)
    holder = leasing.lease_holder("w1")
    for states in seen:
        running = [state for state in states if state[0] == "running"]
        assert 1 <= len(running) <= 3
        assert all(by == holder and lease > utcnow() for _, by, lease in running)
    assert seen[-1].count(("done", holder, None)) == len(PROMPTS) - 1  # done: who did it, no lease
    assert all(status == "done" for status, _, _ in item_states(settings, job_id))


def test_a_crashed_batch_sends_its_items_back_and_they_finish_one_at_a_time(
    pg_url: str, tiny_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch dies once it has admitted a 4th request: the rows in flight (the 4th among them) go
    back (their try counted, the error kept on the attempt) and decode alone; nothing is lost."""
    real = Engine.step
    crashes = []
    admitted: set[int] = set()

    def crashing(self):
        admitted.update(row.request.key for row in self.waiting)
        if len(admitted) >= 4 and not crashes:
            crashes.append(sorted(admitted)[3])
            # a batch's own fault (a sticky CUDA error is the worker's: tests/worker/test_devices.py)
            raise RuntimeError("index 2048 is out of bounds for dimension 0 with size 2048")
        return real(self)

    monkeypatch.setattr(Engine, "step", crashing)
    settings = Settings(database_url=pg_url, retry_backoff_s=0.01)
    path = write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": p}) for p in PROMPTS])
    job, rows = run_job(settings, path, draft_spec(tiny_pair, 3))
    _, reference = run_job(settings, path, draft_spec(tiny_pair, 1))

    assert crashes and (job.status, job.done, job.failed) == ("completed", len(PROMPTS), 0)
    assert [row["output"] for row in rows] == [row["output"] for row in reference]
    with session_scope(settings.database_url) as session:
        attempts = session.execute(
            select(Item.seq, Item.attempts, Attempt.error)
            .join(Attempt, Attempt.item_id == Item.id)
            .where(Item.job_id == job.id)
            .order_by(Item.seq, Attempt.id)
        ).all()
    lost = {seq for seq, _, error in attempts if error and "out of bounds" in error}
    assert 1 <= len(lost) <= 4  # the rows in flight when it crashed, the 4th among them
    for seq, tries, _ in attempts:
        assert tries == (2 if seq in lost else 1)
