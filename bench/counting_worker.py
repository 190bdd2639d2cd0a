"""`genjob` that counts its database round trips (for bench/pipeline.py): ``python bench/counting_worker.py
[--noop] worker -Q …``.

Every statement, BEGIN, COMMIT, ROLLBACK and pool pre-ping of every engine in this process (and the
pool processes it forks) is counted (not BEGIN/COMMIT in autocommit: none is sent); after each task
a pool process writes its counts to ``$GENJOB_BENCH_COUNT_DIR/<pid>.json`` and the time it spent
inside tasks to ``<pid>.tasks``. ``--noop`` swaps the models for the no-op stand-in of the tests
(tests/doubles/model_doubles.py: an item "generates" one token instantly). With
``$GENJOB_BENCH_PROFILE_DIR`` set, each pool process runs under cProfile from its first task on (the
waits between tasks included) and writes ``<pid>.prof`` after each task (``python -m pstats``).
"""

from __future__ import annotations

import cProfile
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

from celery.signals import task_postrun, task_prerun
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.engine.default import DefaultDialect

COUNTS: Counter[str] = Counter()
TASKS: dict[str, float] = {}  # how many tasks this process ran and the time it spent inside them
PROFILER: cProfile.Profile | None = None


@event.listens_for(Engine, "before_cursor_execute")
def _statement(conn, cursor, statement, parameters, context, executemany) -> None:
    COUNTS["statements"] += 1


def _sent(conn) -> bool:
    """Whether a BEGIN, COMMIT or ROLLBACK goes to the server: not in autocommit (db.run_statement)."""
    return not getattr(conn.connection.driver_connection, "autocommit", False)


@event.listens_for(Engine, "begin")
def _begin(conn) -> None:
    COUNTS["begin"] += _sent(conn)


@event.listens_for(Engine, "commit")
def _commit(conn) -> None:
    COUNTS["commit"] += _sent(conn)


@event.listens_for(Engine, "rollback")
def _rollback(conn) -> None:
    COUNTS["rollback"] += _sent(conn)


_ping = DefaultDialect._do_ping_w_event


def _counted_ping(self, dbapi_connection):
    COUNTS["pre_ping"] += 1  # pool_pre_ping: a SELECT 1 before a pooled connection is used
    return _ping(self, dbapi_connection)


DefaultDialect._do_ping_w_event = _counted_ping  # type: ignore[method-assign]


@task_prerun.connect(weak=False)
def _profile(**_kwargs) -> None:
    global PROFILER  # from the first task on, waits between tasks included
    directory = os.environ.get("GENJOB_BENCH_COUNT_DIR")
    if directory and not Path(directory, f"{os.getpid()}.json").exists():
        COUNTS.clear()  # the bench removed the files (after its warm-up job): count from here
        TASKS.clear()
    TASKS["started"] = time.time()
    if PROFILER is None and os.environ.get("GENJOB_BENCH_PROFILE_DIR"):
        PROFILER = cProfile.Profile()
        PROFILER.enable()


@task_postrun.connect(weak=False)
def _dump(**_kwargs) -> None:
    directory = os.environ.get("GENJOB_BENCH_COUNT_DIR")
    if directory:
        Path(directory, f"{os.getpid()}.json").write_text(json.dumps(COUNTS))
        TASKS["last"] = time.time()
        TASKS["tasks"] = TASKS.get("tasks", 0) + 1
        TASKS["in_tasks"] = TASKS.get("in_tasks", 0.0) + TASKS["last"] - TASKS["started"]
        Path(directory, f"{os.getpid()}.tasks").write_text(json.dumps(TASKS))
    profiles = os.environ.get("GENJOB_BENCH_PROFILE_DIR")
    if PROFILER is not None and profiles:
        PROFILER.disable()
        PROFILER.dump_stats(str(Path(profiles, f"{os.getpid()}.prof")))
        PROFILER.enable()


if __name__ == "__main__":
    if "--noop" in sys.argv:
        sys.argv.remove("--noop")
        from model_doubles import scripted_runner

        from genjob.worker.chunks import PROCESS

        PROCESS.runners.build = scripted_runner
    from genjob.cli import main

    main()
