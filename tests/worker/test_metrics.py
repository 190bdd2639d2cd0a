"""The worker's meter (``genjob.worker.metrics``) in-process, around an engine stand-in: tokens per second
and acceptance as gauges (0 tokens/s once the chunk ends), item latency (a lossless twin is no item),
prefill tokens, rows per round, model-load and calibration seconds; the ``model`` label is the
catalog's name where there is one, else short, and bounded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import REGISTRY

from genjob.generation.engine_stats import EngineStats
from genjob.generation.requests import Finished, RowStats
from genjob.options import JobSpec
from genjob.worker import metrics
from genjob.worker.chunk_context import ChunkOutcome
from genjob.worker.runners import RunnerCache


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@dataclass
class Engine:
    """Each step: one prefill of ``rows`` rows, one round of them, and the rows finished."""

    rows: int = 4
    stats: EngineStats = field(default_factory=EngineStats)
    busy: int = 0

    def step(self) -> list[Finished]:
        self.stats.prefill(rows=self.rows, tokens=10 * self.rows, seconds=0.01)
        self.stats.round(
            batch=self.rows,
            k=4,
            probe=False,
            tokens=3 * self.rows,
            seconds=0.02,
            proposed=4 * self.rows,
            accepted=2 * self.rows,
            rejections=self.rows,
            drafts=[4] * self.rows,
        )
        finished = [Finished(key=key, token_ids=[1], stats=RowStats(wall_s=0.3)) for key in range(self.rows)]
        return [*finished, Finished(key=-1, token_ids=[1], stats=RowStats(wall_s=9.0))]  # a lossless twin


@pytest.fixture
def catalog(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    names = {"/srv/models/qwen-7b": "qwen"}
    monkeypatch.setattr(metrics, "_catalog_names", lambda: names)
    return names


def test_a_chunk_is_metered_as_a_dashboard_graphs_it(catalog: dict[str, str]) -> None:
    labels = {"model": "qwen", "queue": "q-meter", "mode": "draft", "worker": "w-meter"}
    engine, outcome = Engine(), ChunkOutcome()
    with metrics.metered(
        engine, outcome, model="/srv/models/qwen-7b", queue="q-meter", mode="draft", worker="w-meter"
    ):
        engine.step()
        engine.step()
        assert value("genjob_tokens_per_second", **labels) > 0
        assert value("genjob_acceptance_rate", **labels) == pytest.approx(0.5)
        outcome.done = 8
    assert value("genjob_tokens_per_second", **labels) == 0  # idle once the chunk ended
    assert value("genjob_acceptance_rate", **labels) == pytest.approx(0.5)  # the latest one stays
    assert value("genjob_prefill_tokens_total", **labels) == 80
    assert value("genjob_new_tokens_total", **labels) == 2 * (12 + 4)  # the rounds' and the prefills'
    assert value("genjob_round_rows_count", **labels) == 2
    assert value("genjob_round_rows_sum", **labels) == 8
    assert value("genjob_item_seconds_count", **labels) == 8  # the twins are not items
    assert value("genjob_item_seconds_sum", **labels) == pytest.approx(8 * 0.3)
    assert value("genjob_item_seconds_bucket", **labels, le="0.5") == 8
    assert value("genjob_items_total", **labels, state="done") == 8


def test_model_labels_are_catalog_names_or_short_and_bounded(
    catalog: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "_OTHER_MODELS", set())
    assert metrics.model_label("/srv/models/qwen-7b") == "qwen"
    assert metrics.model_label("/home/me/checkpoints/step-900/") == "step-900"
    assert metrics.model_label("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    for n in range(metrics.MAX_MODEL_LABELS):
        metrics.model_label(f"/tmp/m{n}")
    assert metrics.model_label("/tmp/one-too-many") == "other"
    assert metrics.model_label("/srv/models/qwen-7b") == "qwen"  # catalog names are never "other"
    assert metrics.model_label("/home/me/checkpoints/step-900") == "step-900"  # one it named before


def test_the_catalog_names_the_models_as_workers_load_them(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    monkeypatch.setenv("GENJOB_MODELS", f'{{"mine": {{"target": "{target}"}}}}')
    from genjob.settings import get_settings

    get_settings.cache_clear()
    metrics._catalog_names.cache_clear()
    try:
        assert metrics._catalog_names()[str(target)] == "mine"
        assert metrics.model_label(str(target)) == "mine"
    finally:
        get_settings.cache_clear()
        metrics._catalog_names.cache_clear()


def test_building_a_runner_is_timed_once_per_job(catalog: dict[str, str]) -> None:
    spec = JobSpec(model="/srv/models/qwen-7b", assistant="/srv/models/qwen-draft", mode="draft")
    built: list[Any] = []

    @dataclass
    class Runner:
        setup_extra_s: float = 2.0

    def build(spec: JobSpec, *, settings: Any) -> Runner:
        built.append(spec)
        return Runner()

    before_load = value("genjob_model_load_seconds_count", model="qwen", mode="draft")
    before_calibration = value("genjob_calibration_seconds_sum", model="qwen", mode="draft")
    cache = RunnerCache(build)
    for _ in range(3):
        cache.get("job-1", spec, settings=None)  # type: ignore[arg-type]
    assert len(built) == 1
    assert value("genjob_model_load_seconds_count", model="qwen", mode="draft") == before_load + 1
    assert value("genjob_calibration_seconds_sum", model="qwen", mode="draft") == before_calibration + 2.0


def test_a_faulted_chunk_and_failed_items_are_counted_by_model(catalog: dict[str, str]) -> None:
    labels = {"model": "qwen", "queue": "q-fault", "mode": "draft", "worker": "w-fault"}
    engine, outcome = Engine(), ChunkOutcome()
    with (
        pytest.raises(RuntimeError),
        metrics.metered(
            engine, outcome, model="/srv/models/qwen-7b", queue="q-fault", mode="draft", worker="w-fault"
        ),
    ):
        engine.step()
        outcome.failed, outcome.retried = 1, 2
        raise RuntimeError("out of memory")
    assert value("genjob_chunks_total", **labels, outcome="faulted") == 1
    assert value("genjob_items_total", **labels, state="failed") == 1
    assert value("genjob_items_total", **labels, state="retried") == 2
    metrics.note_swept_items(
        {"j1": ("/srv/models/qwen-7b", "q-fault", "draft")},
        worker="w-fault",
        retried={"j1": 5},
        failed={"j1": 16, "gone": 3},
    )
    assert value("genjob_items_total", **labels, state="failed") == 17
    assert value("genjob_items_total", **labels, state="retried") == 7


def test_stalled_processes_are_a_gauge() -> None:
    report = {"processes": [{"stalled": True}, {"stalled": False}]}
    assert metrics.stalled_exposition(report).decode().splitlines()[-1] == "genjob_worker_stalled_processes 1"
