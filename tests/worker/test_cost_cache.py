"""The measured forward costs kept on disk: reused by a new process, measured again when anything they
depend on changes, and never charged twice to a job."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from genjob.generation import costs
from genjob.generation.costs import CostModel
from genjob.generation.loading import load_model
from genjob.options import JobSpec
from genjob.settings import Settings
from genjob.worker import cost_cache, runners


@pytest.fixture(autouse=True)
def steady_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every measurement counts as steady: whether the suite's machine is busy is not under test here."""
    monkeypatch.setattr(costs, "STEADY_TOLERANCE", float("inf"))


@pytest.fixture
def pair(tiny_pair: tuple[Path, Path]) -> tuple[object, object]:
    target, draft = tiny_pair
    return load_model(str(target)), load_model(str(draft))


def test_a_stored_measurement_is_reused_exactly(tmp_path: Path, pair: tuple) -> None:
    target, draft = pair
    first = cost_cache.load_or_measure(str(tmp_path), target, draft, max_batch=2, max_query=3)
    assert first.measure_seconds > 0
    [stored] = list(tmp_path.glob("*.json"))
    again = cost_cache.load_or_measure(str(tmp_path), target, draft, max_batch=2, max_query=3)
    assert again.measure_seconds == 0.0  # nothing measured: a job is charged nothing for it
    assert again.to_json() == first.to_json()
    assert list(tmp_path.glob("*.json")) == [stored]


def test_a_larger_grid_serves_smaller_jobs_and_another_pair_is_measured_on_its_own(
    tmp_path: Path, pair: tuple
) -> None:
    target, draft = pair
    large = cost_cache.load_or_measure(str(tmp_path), target, draft, max_batch=4, max_query=5)
    for batch, query in ((1, 2), (4, 5), (3, 4)):
        reused = cost_cache.load_or_measure(str(tmp_path), target, draft, max_batch=batch, max_query=query)
        assert reused.measure_seconds == 0.0 and reused.to_json() == large.to_json()
    cost_cache.load_or_measure(str(tmp_path), target, draft, max_batch=8, max_query=3)  # B beyond it
    cost_cache.load_or_measure(str(tmp_path), target, draft, max_batch=2, max_query=6)  # q beyond it
    cost_cache.load_or_measure(str(tmp_path), target, None, max_batch=2, max_query=3)  # no draft
    assert len(list(tmp_path.glob("*.json"))) == 4


def test_retrained_weights_in_the_same_place_are_measured_again(
    tmp_path: Path, tiny_pair: tuple[Path, Path], pair: tuple
) -> None:
    target, _ = pair
    cost_cache.load_or_measure(str(tmp_path), target, None, max_batch=1, max_query=2)
    weights = next(p for p in tiny_pair[0].iterdir() if p.suffix == ".safetensors")
    stat = weights.stat()
    try:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        again = cost_cache.load_or_measure(str(tmp_path), target, None, max_batch=1, max_query=2)
    finally:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert again.measure_seconds > 0
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_an_unreadable_or_stale_file_is_measured_again_and_replaced(tmp_path: Path, pair: tuple) -> None:
    target, draft = pair
    cost_cache.load_or_measure(str(tmp_path), target, draft, max_batch=1, max_query=2)
    [stored] = list(tmp_path.glob("*.json"))
    stored.write_text('{"batch_sizes": [1], "query_lengths"')
    again = cost_cache.load_or_measure(str(tmp_path), target, draft, max_batch=1, max_query=2)
    assert again.measure_seconds > 0
    assert CostModel.from_json(json.loads(stored.read_text())).to_json() == again.to_json()
    old = stored.stat().st_mtime - cost_cache.MAX_AGE_S - 60
    os.utime(stored, (old, old))
    assert (
        cost_cache.load_or_measure(str(tmp_path), target, draft, max_batch=1, max_query=2).measure_seconds > 0
    )


def test_a_measurement_taken_on_a_busy_machine_serves_but_is_not_kept(
    tmp_path: Path, pair: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(costs, "STEADY_TOLERANCE", -1.0)  # no two passes ever agree this closely
    target, draft = pair
    measured = cost_cache.load_or_measure(str(tmp_path), target, draft, max_batch=1, max_query=2)
    assert not measured.steady and measured.measure_seconds > 0
    assert not list(tmp_path.iterdir())


def test_without_a_directory_nothing_is_stored(tmp_path: Path, pair: tuple) -> None:
    target, draft = pair
    for _ in range(2):
        measured = cost_cache.load_or_measure("", target, draft, max_batch=1, max_query=2)
        assert measured.measure_seconds > 0
    assert not list(tmp_path.iterdir())


def test_a_new_process_running_the_same_draft_job_is_charged_no_setup(
    tmp_path: Path, tiny_pair: tuple[Path, Path]
) -> None:
    target, draft = tiny_pair
    spec = JobSpec(model=str(target), assistant=str(draft), draft_tokens=3, batch_size=2)
    settings = Settings(cost_cache_dir=str(tmp_path))
    runners.measured_costs.cache_clear()
    assert runners.JobRunner.build(spec, settings=settings).setup_extra_s > 0
    runners.measured_costs.cache_clear()  # as in a new worker process
    assert runners.JobRunner.build(spec, settings=settings).setup_extra_s == 0.0
