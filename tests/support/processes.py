"""Real genjob processes for the tests and the benchmarks: their environment, workers and other services,
the CLI, and a redis-server of a test's own.

Every service runs in a session of its own, so a stop or a kill reaches its children too (a worker's
pool processes). Workers run the real Celery worker on the real broker and database; by default only
the models are replaced (the scripted stand-in, ``tests/doubles/model_doubles.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import httpx
import redis

from tests.support.databases import REDIS_URL
from tests.support.waiting import NOT_UP, wait_for

GENJOB = str(Path(sys.executable).with_name("genjob"))
# On the processes' path: only the doubles (tests/ itself has genjob/ and worker/ folders).
DOUBLES_DIR = Path(__file__).resolve().parents[1] / "doubles"
# `genjob` with the scripted stand-in for the models (tests/doubles/scripted_worker.py).
SCRIPTED_GENJOB = [sys.executable, "-m", "scripted_worker"]
# Measured forward costs, shared by the suite's processes (workers included) and removed after it.
COST_CACHE_DIR = Path(tempfile.gettempdir()) / f"genjob-test-costs-{os.getpid()}"

# Short leases and sweeps, quick retries.
FAST_RECOVERY = {
    "lease_s": "5",
    "sweep_interval_s": "0.5",
    "retry_backoff_s": "0.1",
    "batch_size": "1",  # the stand-in decodes one item at a time (worker/batched.py needs real models)
}


def service_env(
    database_url: str, queue: str, *, broker_url: str | None = REDIS_URL, **settings: str | None
) -> dict[str, str]:
    """The environment of a genjob process (the CLI, a worker, the API): this process's without any
    GENJOB_* or FLOWER_*, ``settings`` as GENJOB_* (one torch thread and the suite's cost cache unless
    given; None leaves a setting out, as ``broker_url=None`` does: embedded mode), the doubles importable."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("GENJOB_", "FLOWER_"))}
    chosen = {
        "database_url": database_url,
        "broker_url": broker_url,
        "queue": queue,
        "torch_threads": "1",
        "cost_cache_dir": str(COST_CACHE_DIR),
        **settings,
    }
    env.update({f"GENJOB_{name.upper()}": value for name, value in chosen.items() if value is not None})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DOUBLES_DIR), os.environ.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    """The children of process ``pid`` (forked by any of its threads): a worker's pool processes."""
    pids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


class ServiceProcess:
    """A process in a session of its own, its output in ``log_path`` (or nowhere); as a context manager,
    stopped after the block. ``stop`` sends its group SIGTERM, and SIGKILL after ``grace`` seconds."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log_path: Path | None = None) -> None:
        self.terminated = False
        self.log_path = log_path
        self._log = log_path.open("w") if log_path is not None else None
        self.process = subprocess.Popen(
            list(argv),
            env=env,
            stdout=self._log if self._log is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def children(self) -> list[int]:
        return child_pids(self.pid)

    def signal(self, sig: int) -> None:
        """``sig`` to the whole group (the process and its children), if it is still there."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group: no chance to clean up."""
        if self.process.poll() is None:
            self.signal(signal.SIGKILL)
        self.process.wait()

    def terminate(self) -> None:
        """SIGTERM to the whole group, once: a graceful stop begins."""
        if not self.terminated and self.process.poll() is None:
            self.signal(signal.SIGTERM)
        self.terminated = True

    def stop(self, grace: float = 20) -> None:
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._log is not None:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path is not None else ""

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def wait_until_serving(base_url: str, *, timeout: float = 60) -> httpx.Response:
    """GET ``base_url``/healthz until it answers 200 (refused while the server starts); returns the answer."""
    return wait_for(
        lambda: (answer := httpx.get(f"{base_url}/healthz", timeout=5)).status_code == 200 and answer,
        timeout=timeout,
        what=f"{base_url}/healthz",
        tolerate=NOT_UP,
    )


def stop_all(processes: Iterable[ServiceProcess], grace: float = 20) -> None:
    """Stop every one of ``processes``: all told at once (SIGTERM), then each waited for."""
    processes = list(processes)
    for process in processes:
        process.terminate()
    for process in processes:
        process.stop(grace)


def worker_argv(
    name: str, queue: str, *, genjob: Sequence[str] = SCRIPTED_GENJOB, quiet: bool = False
) -> list[str]:
    """`genjob worker -c 1` named ``name@host`` on ``queue``: the scripted stand-in for the models unless
    ``genjob`` says otherwise (``[GENJOB]``: the real one); INFO logs, or only warnings when ``quiet``."""
    command = ["worker", "-Q", queue, "-c", "1", "-n", f"{name}@%h"]
    return [*genjob, *command, "-l", "WARNING"] if quiet else [*genjob, "-v", *command]


class WorkerProcess(ServiceProcess):
    """One `genjob worker -c 1` (a Celery main process and its one pool child) on the queue of ``env``;
    ``worker_argv`` says which."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        log_path: Path | None = None,
        *,
        genjob: Sequence[str] = SCRIPTED_GENJOB,
        quiet: bool = False,
    ) -> None:
        self.name = name
        super().__init__(worker_argv(name, env["GENJOB_QUEUE"], genjob=genjob, quiet=quiet), env, log_path)


class RedisServer:
    """A redis-server of its own, without persistence like scripts/services.sh: a restart loses all."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [shutil.which("redis-server") or "redis-server", "--port", str(self.port)]
        argv += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.directory)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, timeout=20, what="redis-server to answer")

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)


def run_cli(
    env: dict[str, str], *args: str, timeout: float = 120, check: bool = False
) -> subprocess.CompletedProcess:
    """`genjob ARGS` (the real models), its output captured as text."""
    return subprocess.run(
        [GENJOB, *args], env=env, capture_output=True, text=True, timeout=timeout, check=check
    )


def submit(env: dict[str, str], path: Path, *args: str) -> str:
    """`genjob submit PATH --mode none -m scripted ARGS`; returns the job id."""
    done = run_cli(env, "submit", str(path), "-m", "scripted", "--mode", "none", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def measured_submit(env: dict[str, str], path: Path, *args: str) -> tuple[str, float, int]:
    """`genjob submit PATH ARGS` under /usr/bin/time: (job id, wall seconds, peak RSS in KiB)."""
    started = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-f", "maxrss=%M", GENJOB, "submit", str(path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.perf_counter() - started
    assert done.returncode == 0, f"genjob submit failed:\n{done.stderr}"
    return done.stdout.strip(), wall, int(done.stderr.strip().rsplit("maxrss=", 1)[1])
