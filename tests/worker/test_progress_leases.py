"""Leases follow progress (``genjob.worker.leasing``): a chunk's leases are renewed only while it beats,
loading gets its own allowance, a stalled chunk is said once and not renewed, a pool process whose
stalled chunk's leases ran out is ended (never an embedded one), and one that moves again is renewed
again; ``progress_report`` (the worker's /healthz) says which pool processes are stalled.

The renewer here renews into a list and "ends the process" by noting it: no database, no kill.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge

from genjob.settings import Settings
from genjob.worker import leasing
from genjob.worker.metrics import progress_report
from tests.support.waiting import wait_for

LEASE_S = 0.3  # renewals every 0.1 s
ROUND_S = 0.25


class Recorder:
    def __init__(self) -> None:
        self.renewed: list[float] = []
        self.ended: list[float] = []

    def renew(self, held: leasing._Held) -> None:
        self.renewed.append(time.monotonic())

    def end(self) -> None:
        self.ended.append(time.monotonic())


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    monkeypatch.setattr(leasing, "KILL_MARGIN_S", 0.05)
    return Recorder()


def renewer(recorder: Recorder, *, armed: bool = True) -> leasing.LeaseRenewer:
    made = leasing.LeaseRenewer(renew=recorder.renew, end_process=recorder.end)
    made.end_when_stalled = armed
    return made


def settings(**values: float) -> Settings:
    return Settings(lease_s=LEASE_S, round_stall_s=ROUND_S, **values)


def poll(predicate: Callable[[], object], *, what: str) -> None:
    wait_for(predicate, timeout=10, what=what, every=0.01)


@pytest.fixture
def beating() -> Iterator[Callable[[leasing.Renewal], threading.Event]]:
    """``beat(renewal)`` beats every 0.02 s from a thread until the returned event is set."""
    stops: list[threading.Event] = []

    def start(renewal: leasing.Renewal) -> threading.Event:
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(0.02):
                renewal.beat()

        threading.Thread(target=run, daemon=True).start()
        stops.append(stop)
        return stop

    yield start
    for stop in stops:
        stop.set()


def test_a_chunk_that_beats_is_renewed_and_never_ended(recorder: Recorder, beating) -> None:
    with renewer(recorder).holding(settings(), item_ids=[1], holder="w/1") as renewal:
        beating(renewal)
        poll(lambda: len(recorder.renewed) >= 8, what="eight renewals")  # 0.8 s: many round bounds
    assert recorder.ended == []


def test_a_stalled_chunk_is_said_once_not_renewed_and_ended_once_its_leases_ran_out(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=leasing.__name__)
    with renewer(recorder).holding(settings(), item_ids=[1, 2], holder="w/7") as renewal:
        renewal.beat()
        last_beat = renewal.held.beat[0]
        poll(lambda: recorder.ended, what="the process to be ended")
        held = renewal.held
    assert all(at <= last_beat + ROUND_S + 0.05 for at in recorder.renewed)  # none past the bound
    # ended once its leases surely ran out: the last renewal (or progress) + a lease + the margin
    assert recorder.ended[0] >= max(recorder.renewed[-1], last_beat) + LEASE_S + 0.05
    assert recorder.ended[0] == pytest.approx(held.kill_at(), abs=0.1)
    stalls = [r.getMessage() for r in caplog.records if "no progress for" in r.getMessage()]
    assert len(stalls) == 1 and stalls[0].startswith("w/7: no progress for ")
    assert "the leases of its 2 items are no longer renewed" in stalls[0]
    assert any("killing this pool process" in r.getMessage() for r in caplog.records)


def test_an_embedded_run_is_not_renewed_when_stalled_but_never_ended(recorder: Recorder) -> None:
    made = renewer(recorder, armed=False)
    checks: list[float] = []
    check = made._check

    def counted(held: leasing._Held, now: float) -> None:
        checks.append(now)
        check(held, now)

    made._check = counted  # type: ignore[method-assign]
    with made.holding(settings(), item_ids=[1], holder="w/1") as renewal:
        poll(lambda: renewal.held.stalled, what="the stall")
        count = len(recorder.renewed)
        poll(lambda: time.monotonic() > renewal.held.kill_at() + 0.3, what="the time it would be ended")
        assert len(recorder.renewed) == count
    assert recorder.ended == []
    late = [at for at in checks if at > renewal.held.kill_at()]
    assert len(late) <= 6  # it wakes at its renewal times (every 0.1 s), it does not spin


def test_loading_has_its_own_allowance(recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=leasing.__name__)
    loading = settings(load_stall_s=1.0)
    with renewer(recorder).holding(loading, item_ids=[1], holder="w/1", allow_s=1.0) as renewal:
        started = time.monotonic()
        poll(lambda: recorder.renewed and recorder.renewed[-1] > started + 2 * ROUND_S, what="renewals")
        assert not renewal.held.stalled  # no beat for twice the round bound, but loading
        renewal.beat()  # loaded: the round bound from here on
        loaded = time.monotonic()
        poll(lambda: renewal.held.stalled, what="the round's stall")
        assert time.monotonic() - loaded >= ROUND_S
    assert "(bound 0.25 s)" in caplog.text


def test_a_beat_with_a_known_wait_allows_it(recorder: Recorder) -> None:
    with renewer(recorder).holding(settings(), item_ids=[1], holder="w/1") as renewal:
        renewal.beat(extra_s=0.5)  # a retry's backoff, say
        waited = time.monotonic()
        poll(lambda: renewal.held.stalled, what="the stall")
        assert time.monotonic() - waited >= ROUND_S + 0.5
        assert any(at > waited + ROUND_S for at in recorder.renewed)


def test_a_chunk_that_moves_again_is_renewed_again_and_not_ended(
    recorder: Recorder, caplog: pytest.LogCaptureFixture, beating
) -> None:
    caplog.set_level(logging.WARNING, logger=leasing.__name__)
    with renewer(recorder).holding(settings(), item_ids=[1], holder="w/1") as renewal:
        poll(lambda: renewal.held.stalled, what="the stall")
        moved = time.monotonic()
        beating(renewal)
        poll(lambda: sum(at > moved for at in recorder.renewed) >= 5, what="renewals again")
        assert not renewal.held.stalled
    assert recorder.ended == []
    assert "w/1: progress again; its leases are renewed again" in caplog.text


def test_a_stalled_chunk_that_stops_is_forgotten_not_ended(recorder: Recorder) -> None:
    made = renewer(recorder)
    with made.holding(settings(), item_ids=[1], holder="w/1") as renewal:
        poll(lambda: renewal.held.stalled, what="the stall")
        held = renewal.held
    count = len(recorder.renewed)
    with made.holding(settings(), item_ids=[2], holder="w/1") as other:  # the thread wakes for this one
        poll(lambda: time.monotonic() > held.kill_at() + 0.2, what="the time it would be ended")
        other.stop()
    assert recorder.ended == [] and len(recorder.renewed) >= count


def test_one_stalled_chunk_does_not_stop_the_renewals_of_another(recorder: Recorder, beating) -> None:
    renewed: dict[str, int] = {}

    def renew(held: leasing._Held) -> None:
        renewed[held.holder] = renewed.get(held.holder, 0) + 1

    made = leasing.LeaseRenewer(renew=renew, end_process=recorder.end)  # not armed
    with (
        made.holding(settings(), item_ids=[1], holder="w/stuck") as stuck,
        made.holding(settings(), item_ids=[2], holder="w/moving") as moving,
    ):
        beating(moving)
        poll(lambda: stuck.held.stalled, what="the stall")
        before = renewed.get("w/stuck", 0)
        poll(lambda: renewed.get("w/moving", 0) >= before + 6, what="the moving chunk's renewals")
        assert renewed.get("w/stuck", 0) == before


def registry_with(processes: dict[str, tuple[float, float, float]]) -> CollectorRegistry:
    """A registry as the multiprocess collector reads it: per pid, (progress time, holding, bound)."""
    registry = CollectorRegistry()
    at = Gauge("genjob_worker_progress_timestamp_seconds", "", ("worker", "pid"), registry=registry)
    holding = Gauge("genjob_worker_holding_chunk", "", ("worker", "pid"), registry=registry)
    bound = Gauge("genjob_worker_stall_bound_seconds", "", ("worker", "pid"), registry=registry)
    for pid, (progress, held, allowed) in processes.items():
        at.labels("w", pid).set(progress)
        holding.labels("w", pid).set(held)
        bound.labels("w", pid).set(allowed)
    return registry


def test_progress_report_says_which_pool_process_is_stalled() -> None:
    now = 1000.0
    report = progress_report(
        registry_with({"11": (now - 5, 1, 30), "12": (now - 40, 0, 30), "13": (now - 60, 1, 600)}), now
    )
    assert report["status"] == "ok"  # 12 holds nothing, 13 is loading
    assert [p["pid"] for p in report["processes"]] == [11, 12, 13]
    stalled = progress_report(registry_with({"11": (now - 5, 1, 30), "14": (now - 31, 1, 30)}), now)
    assert stalled["status"] == "stalled"
    assert [p for p in stalled["processes"] if p["stalled"]] == [
        {"pid": 14, "holding": True, "since_progress_s": 31.0, "bound_s": 30.0, "stalled": True}
    ]
    assert progress_report(CollectorRegistry(), now) == {"status": "ok", "processes": []}
