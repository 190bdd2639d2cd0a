"""Following jobs from another terminal: wait --timeout, the idle-queue warning, top, lazy imports,
Ctrl-C in embedded mode (a real process: it must exit 130 and leave the job resumable), and what
`wait` says of an embedded job that no process runs yet."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from genjob.cli import main
from genjob.cli.follow import IdleWatch, _phase
from genjob.cli.pace import Pace
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.tables import Job
from tests.support.processes import SCRIPTED_GENJOB, service_env
from tests.support.prompts import write_jsonl
from tests.support.waiting import wait_for


@pytest.fixture
def two_prompts(broker_env: Settings, tmp_path: Path) -> Path:
    """p.jsonl, two prompts, in the working directory; Postgres and a queue no worker consumes."""
    return write_jsonl(tmp_path / "p.jsonl", ['{"prompt": "a"}', '{"prompt": "b"}'])


def test_wait_times_out_and_warns_that_nothing_consumes_the_queue(
    two_prompts: Path, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GENJOB_QUEUE_IDLE_WARN_S", "0.3")
    job_id = CliRunner().invoke(main, ["submit", "p.jsonl", "-m", "m", "--mode", "none"]).stdout.strip()
    result = CliRunner().invoke(main, ["wait", job_id, "--timeout", "2s"])
    assert result.exit_code == 5
    warning, end = result.stderr.splitlines()
    assert re.fullmatch(
        rf"warning: no worker has taken anything from queue '{queue_name}' for \d s \(1 chunk waiting\): "
        rf"is one running\? genjob worker -Q {queue_name}",
        warning,
    )
    assert end == "still queued after 0:00:02: 0 done, 0 failed of 2"
    assert CliRunner().invoke(main, ["cancel", job_id]).exit_code == 0


def test_top_once_shows_the_live_jobs_and_the_queues(two_prompts: Path, queue_name: str) -> None:
    job_id = CliRunner().invoke(main, ["submit", "p.jsonl", "-m", "m", "--mode", "none"]).stdout.strip()
    result = CliRunner().invoke(main, ["top", "--once"], terminal_width=200)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if job_id in line)
    assert row.split()[1:3] == ["queued", "0"] and "░░░░░░░░░░   0%  0/2" in row
    assert "queues: " in result.stdout
    # Other tests' live jobs may be listed too, and their queues wrap the queues line at spaces.
    assert f"{queue_name}: 1 waiting" in " ".join(result.stdout.split())
    assert CliRunner().invoke(main, ["cancel", job_id]).exit_code == 0


@pytest.mark.parametrize("args", [["--help"], ["status", "nope"], ["jobs"]])
def test_commands_that_need_no_model_import_no_torch(embedded_env: str, args: list[str]) -> None:
    heavy = ("torch", "transformers", "genjob.worker.chunks", "genjob.generation.engine", "prometheus_client")
    code = (
        f"import sys\nfrom genjob.cli import main\ntry:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "[]", done.stderr


def test_ctrl_c_in_embedded_mode_leaves_the_job_resumable(embedded_env: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"  # items after the first two wait while it exists: Ctrl-C lands mid-job
    gate.touch()
    prompts = [
        json.dumps({"prompt": f"item {i} sleep=0.2" if i < 2 else f"item {i} hold-while={gate}"})
        for i in range(15)
    ]
    write_jsonl(tmp_path / "p.jsonl", prompts)
    env = service_env(embedded_env, "gpu", broker_url=None, batch_size="1", chunk_size="4")
    process = subprocess.Popen(
        [*SCRIPTED_GENJOB, "submit", "p.jsonl", "-m", "m", "--mode", "none", "--wait"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # An earlier test's library may leave SIGINT ignored in this process, which a child inherits.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    job_id = process.stdout.readline().strip()

    def done_items() -> int:
        with session_scope(embedded_env) as session:
            job = session.get(Job, job_id, populate_existing=True)
            return job.done if job is not None else 0

    wait_for(lambda: done_items() >= 2, timeout=60, what="two items done")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert "terminate called" not in err
    match = re.search(
        rf"interrupted: job {job_id} stopped \((\d+) of 15 done; (\d) items? in flight given back\); "
        rf"resume it with `genjob requeue {job_id}`, or drop it with `genjob cancel {job_id}`",
        err,
    )
    assert match, err
    with session_scope(embedded_env) as session:
        assert session.get(Job, job_id).status == "running"

    gate.unlink()
    resumed = subprocess.run(
        [*SCRIPTED_GENJOB, "requeue", job_id],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    with session_scope(embedded_env) as session:
        job = session.get(Job, job_id, populate_existing=True)
        assert (job.status, job.done, job.failed) == ("completed", 15, 0)


def _job(done: int, tokens: int, accepted: int, proposed: int) -> Job:
    return Job(
        id="j",
        status="running",
        queue="gpu",
        total=100,
        done=done,
        failed=0,
        new_tokens=tokens,
        draft_accepted=accepted,
        draft_proposed=proposed,
    )


def test_the_progress_fields_are_the_recent_pace() -> None:
    pace = Pace()
    pace.add(_job(10, 1000, 0, 0), now=100.0)
    assert pace.fields(_job(10, 1000, 0, 0)) == {"rate": "", "accept": "", "eta": ""}
    later = _job(30, 5000, 300, 400)
    pace.add(later, now=110.0)
    assert pace.fields(later) == {"rate": "400 tok/s", "accept": "α 75%", "eta": "ETA 0:00:35"}


def test_the_idle_warning_comes_once_until_something_moves() -> None:
    idle = IdleWatch(warn_after=5)
    queued = Job(id="j", status="queued", queue="gpu", done=0, failed=0)
    assert idle.check(queued, running=0, depth=3, now=0.0) is None
    assert idle.check(queued, running=0, depth=3, now=4.0) is None
    assert idle.check(queued, running=0, depth=3, now=6.0) == (
        "warning: no worker has taken anything from queue 'gpu' for 6 s (3 chunks waiting): "
        "is one running? genjob worker -Q gpu"
    )
    assert idle.check(queued, running=0, depth=3, now=20.0) is None  # said once
    assert idle.check(queued, running=0, depth=2, now=21.0) is None  # a chunk was taken: it moved
    assert idle.check(queued, running=1, depth=2, now=40.0) is None  # a long item is running


def test_wait_in_embedded_mode_says_the_job_runs_where_it_was_submitted(embedded_env: str) -> None:
    """No broker, so no worker: the submitting process runs the job; another one following it says so
    (once), never 'waiting for a worker'."""
    CliRunner().invoke(main, ["jobs"])  # the embedded database, migrated
    with session_scope(embedded_env) as session:
        session.add(
            Job(id="3a0000000000", status="queued", model="m", mode="none", spec={}, queue="gpu", total=2)
        )
    result = CliRunner().invoke(main, ["wait", "3a", "--timeout", "1s"])
    assert (result.exit_code, result.stdout, result.stderr) == (
        5,
        "",
        "job 3a0000000000 runs in the process that submitted it (embedded mode: no GENJOB_BROKER_URL, "
        "no workers); if that process has stopped, run the rest with `genjob requeue 3a0000000000`\n"
        "still queued after 0:00:01: 0 done, 0 failed of 2\n",
    )
    quiet = CliRunner().invoke(main, ["wait", "3a", "--timeout", "1s", "-q"])
    assert (quiet.exit_code, quiet.stderr) == (5, "still queued after 0:00:01: 0 done, 0 failed of 2\n")


def test_the_phase_names_who_runs_the_job() -> None:
    queued = Job(id="j", status="queued", done=0)
    started = Job(id="j", status="running", done=0)  # taken, nothing in flight yet (loading the models)
    assert _phase(queued, 0, here=False, embedded=False) == "waiting for a worker"
    assert _phase(started, 0, here=False, embedded=False) == "waiting for a worker"
    assert _phase(queued, 0, here=True, embedded=True) == "starting"  # this process runs it
    assert _phase(queued, 0, here=False, embedded=True) == "waiting for its submit"
    assert _phase(started, 0, here=False, embedded=True) == "waiting for its submit"
    assert _phase(started, 2, here=False, embedded=True) == "running"
