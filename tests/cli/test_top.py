"""`genjob top`: the columns that matter kept on an 80-column terminal, the sparklines only with room,
workers marked offline, and the same recent pace as `genjob wait` (one ``Pace``, seeded from results)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from rich.console import Console

from genjob.cli import main
from genjob.cli.pace import RATE_WINDOW_S, Pace
from genjob.cli.top import (
    COLUMNS,
    Column,
    Frame,
    History,
    JobView,
    WorkerView,
    _worker_views,
    collect,
    fitted,
    render,
    sparkline,
)
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.store.activity import WorkerActivity
from genjob.tables import Item, Job
from tests.support.store import result_of

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SUMS = ("new_tokens", "draft_accepted", "draft_proposed", "busy_seconds", "decode_seconds", "decode_tokens")


def _job(done: int = 40, tokens: int = 1600, accepted: int = 30, proposed: int = 40, **fields: object) -> Job:
    job = Job(
        id="abc123def456", name="nightly", status="running", total=100, done=done, failed=2, queue="gpu"
    )
    for name in (*SUMS, "probe_seconds", "probe_tokens"):
        setattr(job, name, 0)
    job.new_tokens, job.draft_accepted, job.draft_proposed = tokens, accepted, proposed
    for name, value in fields.items():
        setattr(job, name, value)
    return job


def _frame() -> Frame:
    pace = Pace()
    pace.add(_job(done=34, tokens=1000, accepted=0, proposed=0), 0.0)
    job = _job()
    pace.add(job, 30.0)
    view = JobView(
        job=job,
        running=3,
        rate=pace.rate(job),
        tokens_per_s=[float(i) for i in range(COLUMNS)],
        acceptance=[None] * (COLUMNS - 2) + [0.5, 1.0],
    )
    workers = [
        WorkerView(WorkerActivity("genjob@gpu1", 42, 6000, NOW, 3), 600, True),
        WorkerView(WorkerActivity("genjob@gpu2", 7, 900, NOW - timedelta(seconds=95), 0), 0, False),
    ]
    return Frame(now=NOW, width=15, jobs=[view], workers=workers, queues={"gpu": 4})


def _text(frame: Frame, width: int) -> list[str]:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(render(frame, History(), width))
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_top_at_80_columns_keeps_the_columns_that_matter() -> None:
    lines = _text(_frame(), 80)
    assert max(len(line) for line in lines) <= 80
    assert lines[1:4] == [
        "job           status   running  done/total  failed  tok/s  α    speedup  ETA",
        "abc123def456  running  3        40/100      2       20.0   75%  -        0:04:50",
        "workers · items: results in 5 min · tok/s: the last 30 s",
    ]
    assert "trend" not in lines[1]  # no room for the sparklines
    assert lines[4:] == [
        "worker       state    running  tok/s  items  last result",
        "genjob@gpu1  online   3        20.0   42     0 s ago",
        "genjob@gpu2  offline  0        0.0    7      95 s ago",
        "queues: gpu: 4 waiting",
    ]


def test_the_queues_line_puts_the_busiest_first_where_the_width_cuts_it() -> None:
    frame = _frame()
    frame.queues = {f"idle-{i:02d}": 0 for i in range(12)} | {"zz-busy": 2, "gpu": 4}
    queues = _text(frame, 80)[-1]
    assert queues.startswith("queues: gpu: 4 waiting  zz-busy: 2 waiting  idle-00: 0 waiting")
    assert queues.endswith("…") and len(queues) <= 80


def test_top_with_room_shows_the_sparklines() -> None:
    lines = _text(_frame(), 240)
    assert lines[1].split() == [
        "job",
        "name",
        "status",
        "running",
        "progress",
        "done/total",
        "failed",
        "tok/s",
        "α",
        "speedup",
        "ETA",
        "tok/s",
        "trend",
        "α",
        "trend",
        "speedup",
        "trend",
    ]
    assert lines[2].split() == [
        "abc123def456",
        "nightly",
        "running",
        "3",
        "████░░░░░░",
        "42%",
        "40/100",
        "2",
        "20.0",
        "75%",
        "-",
        "0:04:50",
        "▁▁▁▂▂▂▃▃▃▄▄▅▅▅▆▆▆▇▇█",
        "▄█",  # no acceptance measured before the last two buckets
    ]


def test_columns_give_way_by_priority_not_position() -> None:
    columns = [Column("a", 2, ["xxxx"]), Column("b", 0, ["xxxx"]), Column("c", 1, ["xxxx"])]
    assert [c.header for c in fitted(columns, 10)] == ["b", "c"]  # 4 + 2 + 4
    assert [c.header for c in fitted(columns, 9)] == ["b"]
    assert [c.header for c in fitted(columns, 2)] == ["b"]  # the first one always


def test_a_worker_that_does_not_answer_is_offline_and_an_idle_one_is_listed() -> None:
    busy = WorkerActivity("genjob@a", 5, 500, NOW, 1)
    stopped = WorkerActivity("genjob@b", 3, 300, NOW, 0)
    recent = [WorkerActivity("genjob@a", 2, 90, NOW, 1)]
    views = _worker_views([busy, stopped], recent, {"genjob@a", "genjob@idle"})
    assert [(v.activity.worker, v.online, v.recent_tokens) for v in views] == [
        ("genjob@a", True, 90),
        ("genjob@b", False, 0),
        ("genjob@idle", True, 0),
    ]
    unknown = _worker_views([busy], [], None)  # no broker to ask
    assert [(v.activity.worker, v.online) for v in unknown] == [("genjob@a", None)]


def test_wait_and_top_tell_the_same_pace() -> None:
    """`wait`'s bar fields and top's columns come from one Pace: 600 tokens and 6 items in 30 s."""
    pace = Pace()
    pace.add(_job(done=34, tokens=1000, accepted=0, proposed=0), 100.0)
    job = _job()
    pace.add(job, 130.0)
    assert pace.fields(job) == {"rate": "20 tok/s", "accept": "α 75%", "eta": "ETA 0:04:50"}
    rate = pace.rate(job)
    assert rate is not None and (rate.tokens_per_s, rate.acceptance) == (20.0, 0.75)


def test_a_seeded_pace_starts_from_the_recent_results() -> None:
    """Top's first frame: the job's counters less what its results of the last 30 s hold."""
    job = _job()
    pace = Pace()
    pace.seed(job, at=1000.0, items=6, tokens=600, accepted=30, proposed=40)
    pace.add(job, 1000.0 + RATE_WINDOW_S)
    assert pace.fields(job) == {"rate": "20 tok/s", "accept": "α 75%", "eta": "ETA 0:04:50"}


def test_collect_rates_a_job_from_its_results_at_once(embedded_env: str) -> None:
    """A job whose 6 results of 100 tokens came in the last half minute: 20 tok/s on the first frame,
    not an average over the sparklines' window."""
    now = datetime.now(UTC)
    settings = Settings(database_url=embedded_env)
    CliRunner().invoke(main, ["jobs"])  # the embedded database, migrated
    with session_scope(embedded_env) as session:
        job = _job(done=6, tokens=600, accepted=0, proposed=0, started_at=now - timedelta(minutes=4))
        job.model, job.mode, job.spec, job.total = "m", "none", {}, 10
        session.add(job)
        session.flush()
        for seq in range(6):
            item = Item(job_id=job.id, seq=seq, line=seq + 1, prompt="p", status="done")
            session.add(item)
            session.flush()
            session.add(
                result_of(
                    item_id=item.id,
                    job_id=job.id,
                    new_tokens=100,
                    target_rounds=100,
                    created_at=now - timedelta(seconds=5 + seq),
                )
            )
    frame = collect(settings, window=timedelta(minutes=5), now=now)
    (view,) = frame.jobs
    assert view.rate is not None
    assert view.rate.tokens_per_s == pytest.approx(600 / RATE_WINDOW_S)
    lines = _text(frame, 80)
    assert lines[2].split()[:6] == ["abc123def456", "running", "0", "6/10", "2", "20.0"]


def test_sparkline_scales_to_its_largest_value() -> None:
    assert sparkline([0, 1, 2, None, 8]) == "▁▁▂ █"
    assert sparkline([None, 0.0]) == " ▁"


def _lines(frame: Frame, width: int, height: int) -> list[str]:
    console = Console(width=width, height=height, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(render(frame, History(), width, height))
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_top_fits_80_by_24_with_a_line_for_the_jobs_left_out_and_a_stalled_worker() -> None:
    frame = _frame()
    frame.jobs = [frame.jobs[0]] * 30
    frame.workers = [
        WorkerView(WorkerActivity("w1", 4, 400, NOW, 2), 60, True),
        WorkerView(WorkerActivity("w2", 0, 0, None, 3, stalled=3), 0, True),  # answers pings, no progress
    ]
    lines = _lines(frame, 80, 24)
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80
    assert lines[0] == "genjob top · 03:04:05 UTC · trends: 5 min"
    assert lines[-6:] == [
        "… 14 more jobs",
        "workers · items: results in 5 min · tok/s: the last 30 s",
        "worker  state    running  tok/s  items  last result",
        "w1      online   2        2.0    4      0 s ago",
        "w2      stalled  3        0.0    0      -",
        "queues: gpu: 4 waiting",
    ]
    assert sum(1 for line in lines if line.startswith("abc123def456")) == 16


def test_top_once_prints_columns_wide(embedded_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "30")
    result = CliRunner().invoke(main, ["top", "--once"])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 30
    assert result.output.splitlines()[0].endswith("…")  # the caption cut, not wrapped
