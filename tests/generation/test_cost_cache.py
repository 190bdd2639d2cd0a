"""The forward costs kept on disk: a job starts from a cheap prior of the rows nothing kept covers, a new
process reuses what earlier ones kept and learnt, anything they depend on changing measures again, and
no job is charged twice."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from genjob.constants import DecodingMode
from genjob.generation import cost_cache, cost_timing
from genjob.generation.costs import CostModel
from genjob.generation.loading import load_model
from genjob.options import JobSpec
from genjob.settings import Settings
from genjob.worker import runners


@pytest.fixture(autouse=True)
def steady_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every measurement counts as steady: whether the suite's machine is busy is not under test here."""
    monkeypatch.setattr(cost_timing, "STEADY_TOLERANCE", float("inf"))


@pytest.fixture
def pair(tiny_pair: tuple[Path, Path]) -> tuple[object, object]:
    target, draft = tiny_pair
    return load_model(str(target)), load_model(str(draft))


def costs_for(directory: Path | str, target, draft, *, batches=(1, 2), max_query=3) -> CostModel:
    path = cost_cache.cost_file(str(directory), target, draft)
    return cost_cache.costs_for(path, target, draft, batches=batches, max_query=max_query)


def test_a_prior_measures_only_the_rows_asked_for_and_is_reused_exactly(tmp_path: Path, pair) -> None:
    target, draft = pair
    first = costs_for(tmp_path, target, draft, batches=(1, 4), max_query=5)
    assert first.measure_seconds > 0
    assert first.batch_sizes == [1, 4] and first.query_lengths == [1, 2, 5]  # a prior, not the grid
    [stored] = list(tmp_path.glob("*.json"))
    again = costs_for(tmp_path, target, draft, batches=(1, 4), max_query=5)
    assert again.measure_seconds == 0.0  # nothing measured: a job is charged nothing for it
    assert again.to_json() == first.to_json()
    for batches, query in (((1,), 2), ((4,), 5), ((1, 4), 3)):
        reused = costs_for(tmp_path, target, draft, batches=batches, max_query=query)
        assert reused.measure_seconds == 0.0
    assert list(tmp_path.glob("*.json")) == [stored]


def test_rows_it_lacks_are_measured_and_merged_into_what_was_kept(tmp_path: Path, pair) -> None:
    target, draft = pair
    costs_for(tmp_path, target, draft, batches=(1, 2), max_query=3)
    wider = costs_for(tmp_path, target, draft, batches=(1, 8), max_query=3)  # B = 8: not covered
    assert wider.measure_seconds > 0 and wider.batch_sizes == [1, 2, 8]
    assert wider.row_weight == {1: 1.0, 2: 1.0, 8: 1.0}  # only B = 8 was measured
    longer = costs_for(tmp_path, target, draft, batches=(2,), max_query=6)  # q beyond what B = 2 had
    assert longer.measure_seconds > 0 and longer.row_query[2] == 6 and longer.row_query[8] == 3
    assert longer.row_weight == {1: 1.0, 2: 2.0, 8: 1.0}  # B = 2 measured twice: both count
    costs_for(tmp_path, target, None, batches=(1, 2), max_query=3)  # no draft: another pair
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_a_grid_serves_the_batch_sizes_between_its_rows() -> None:
    grid = CostModel([1, 2, 4, 8], [1, 3], {b: [1.0, 2.0] for b in (1, 2, 4, 8)}, {}, context=64)
    assert all(grid.covers(b, 3) for b in (1, 3, 5, 8))
    assert not grid.covers(9, 3) and not grid.covers(4, 4)
    sparse = CostModel([1, 8], [1, 3], {b: [1.0, 2.0] for b in (1, 8)}, {}, context=64)
    assert sparse.covers(8, 3) and not sparse.covers(4, 3)  # rows too far apart to interpolate


def test_what_live_rounds_learnt_is_kept_for_the_next_process(tmp_path: Path, pair) -> None:
    target, draft = pair
    path = cost_cache.cost_file(str(tmp_path), target, draft)
    live = cost_cache.costs_for(path, target, draft, batches=(1, 2), max_query=3)
    for _ in range(10):
        live.observe(2, 2, 3 * live.predicted(2, 2))  # rounds cost three times what the prior says
    cost_cache.remember(path, live)
    assert not live.scale_rounds  # counted as kept: a second remember adds nothing twice
    later = cost_cache.costs_for(path, target, draft, batches=(1, 2), max_query=3)
    assert later.measure_seconds == 0.0
    assert later.scale[2] == pytest.approx(live.scale[2]) and later.scale_weight[2] == 10
    assert later.round_seconds(2, 2) == pytest.approx(live.round_seconds(2, 2))


def test_retrained_weights_in_the_same_place_are_measured_again(
    tmp_path: Path, tiny_pair: tuple[Path, Path], pair
) -> None:
    target, _ = pair
    costs_for(tmp_path, target, None, batches=(1,), max_query=2)
    weights = next(p for p in tiny_pair[0].iterdir() if p.suffix == ".safetensors")
    stat = weights.stat()
    try:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        again = costs_for(tmp_path, target, None, batches=(1,), max_query=2)
    finally:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert again.measure_seconds > 0
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_an_unreadable_or_stale_file_is_measured_again_and_replaced(tmp_path: Path, pair) -> None:
    target, draft = pair
    costs_for(tmp_path, target, draft, batches=(1,), max_query=2)
    [stored] = list(tmp_path.glob("*.json"))
    stored.write_text('{"batch_sizes": [1], "query_lengths"')
    again = costs_for(tmp_path, target, draft, batches=(1,), max_query=2)
    assert again.measure_seconds > 0
    assert CostModel.from_json(json.loads(stored.read_text())).to_json() == again.to_json()
    old = stored.stat().st_mtime - cost_cache.MAX_AGE_S - 60
    os.utime(stored, (old, old))
    assert costs_for(tmp_path, target, draft, batches=(1,), max_query=2).measure_seconds > 0


def test_a_calibration_on_a_busy_machine_is_kept_counting_less(
    tmp_path: Path, pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, draft = pair
    path = cost_cache.cost_file(str(tmp_path), target, draft)
    monkeypatch.setattr(cost_timing, "STEADY_TOLERANCE", -1.0)  # no two passes ever agree this closely
    busy = cost_cache.calibrate(path, target, draft, max_batch=2, max_query=2)
    assert not busy.steady and busy.row_weight == {1: 1.0, 2: 1.0}
    assert costs_for(tmp_path, target, draft, batches=(1, 2), max_query=2).measure_seconds == 0.0  # kept
    monkeypatch.setattr(cost_timing, "STEADY_TOLERANCE", float("inf"))
    steady = cost_cache.calibrate(path, target, draft, max_batch=2, max_query=2)  # measured again
    assert steady.measure_seconds > 0 and steady.row_weight == {1: 4.0, 2: 4.0}
    read = cost_cache.calibrate(path, target, draft, max_batch=2, max_query=2)
    assert read.measure_seconds == 0.0 and read.to_json() == steady.to_json()


def test_without_a_directory_nothing_is_stored(tmp_path: Path, pair) -> None:
    target, draft = pair
    for _ in range(2):
        assert cost_cache.costs_for(None, target, draft, batches=(1,), max_query=2).measure_seconds > 0
    assert not list(tmp_path.iterdir())


def test_a_new_process_running_the_same_draft_job_is_charged_no_measuring(
    tmp_path: Path, tiny_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first runner measures its prior and is charged for it (and for loading its draft); a later
    process reads the kept costs, and is charged only for loading the draft (here cached: next to 0)."""
    target, draft = tiny_pair
    spec = JobSpec(model=str(target), assistant=str(draft), draft_tokens=3, batch_size=2)
    settings = Settings(cost_cache_dir=str(tmp_path))
    cost_cache.measured_costs.cache_clear()
    first = runners.JobRunner.build(spec, settings=settings)
    assert first.engine.costs is not None and first.setup_extra_s >= first.engine.costs.measure_seconds > 0
    cost_cache.measured_costs.cache_clear()  # as in a new worker process
    monkeypatch.setattr(cost_timing, "measure", _no_timing)
    assert runners.JobRunner.build(spec, settings=settings).setup_extra_s < 0.1


def _no_timing(*_args: object, **_kwargs: object) -> None:
    raise AssertionError("costs measured again")


def test_a_plain_job_with_its_batch_size_measures_nothing(
    tmp_path: Path, tiny_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_timing(*_args, **_kwargs):
        raise AssertionError("a plain job with --batch-size measured costs")

    monkeypatch.setattr(cost_timing, "measure", no_timing)
    target, _ = tiny_pair
    cost_cache.measured_costs.cache_clear()
    spec = JobSpec(model=str(target), mode="none", batch_size=4)
    runner = runners.JobRunner.build(spec, settings=Settings(cost_cache_dir=str(tmp_path)))
    assert runner.engine.costs is None and runner.setup_extra_s == 0.0
    assert not list(tmp_path.iterdir())


def test_a_runner_reads_the_costs_calibrate_kept_for_its_spec(
    tmp_path: Path, tiny_pair: tuple[Path, Path], pair
) -> None:
    """``genjob calibrate -m M -a D`` in the default mode (auto, with a draft) measures the pair the job's
    runner loads: the runner reads the file calibrate wrote, and measures nothing itself."""
    target, draft = tiny_pair
    spec = JobSpec(model=str(target), assistant=str(draft), draft_tokens=3, batch_size=2)
    assert spec.mode is DecodingMode.AUTO
    settings = Settings(cost_cache_dir=str(tmp_path))
    cost_cache.measured_costs.cache_clear()
    calibrated, batch, k_max = runners.calibrate(spec, settings=settings)
    kept = cost_cache.cost_file(str(tmp_path), *pair)  # the pair's file, the draft's costs with it
    assert kept is not None and kept.is_file() and (batch, k_max) == (2, 3)
    written = kept.read_bytes()
    cost_cache.measured_costs.cache_clear()  # as a worker process started later
    runner = runners.JobRunner.build(spec, settings=settings)
    assert runner.cost_path == kept and runner.setup_extra_s < 0.1  # the draft, loaded already
    assert runner.engine.costs is not None and runner.engine.costs.measure_seconds == 0.0
    assert kept.read_bytes() == written and calibrated.covers(2, k_max + 1)
