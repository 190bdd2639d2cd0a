"""How long the CLI takes to answer the commands a user types most: ``genjob --help`` and ``genjob status``.

Each command runs ``--runs`` times as a fresh process (``python -m genjob.cli`` is not an entry point:
the process runs ``from genjob.cli import main; main()``, as the installed ``genjob`` script does), on
an embedded SQLite database holding one job, migrated beforehand so that no run pays for the
migration. Prints each command's fastest, median and slowest wall-clock seconds, the median CPU
seconds (user + system) of the process, which a busy machine inflates less than the wall clock, and the
machine's load average. ``--src TREE`` times another revision's package instead, for a before and
after on the same machine in the same minutes:

    git archive REV | tar -x -C DIR && .venv/bin/python DIR/scripts/package_tree.py DIR
    .venv/bin/python bench/cli_startup.py [--runs 15] [--src DIR/build/package-tree]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = "import sys\nfrom genjob.cli import main\nsys.argv[0] = 'genjob'\nmain()\n"
JOB_ID = "be0000000000"
COMMANDS = {"genjob --help": ["--help"], "genjob status": ["status", JOB_ID[:6]]}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def genjob(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds) of one ``genjob ARGS`` process."""
    started, cpu = time.perf_counter(), cpu_seconds()
    done = subprocess.run(
        [sys.executable, "-c", RUN, *args], env=env, cwd=cwd, capture_output=True, text=True
    )
    took = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"genjob {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return took, cpu_seconds() - cpu


def add_job(url: str, env: dict[str, str], cwd: Path) -> None:
    """Migrate the database (``genjob jobs``) and store one finished job in it."""
    genjob(["jobs"], env, cwd)
    code = (
        "import sys\nfrom datetime import UTC, datetime\nfrom genjob.db import session_scope\n"
        "from genjob.tables import Job\n"
        f"with session_scope({url!r}) as session:\n"
        f"    session.add(Job(id={JOB_ID!r}, model='m', mode='none', spec={{}}, queue='gpu', total=1,"
        " status='completed', done=1, created_at=datetime.now(UTC)))\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--src", type=Path, help="a checkout whose package to time instead of this one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        cwd = Path(directory)
        url = f"sqlite:///{cwd / 'genjob.db'}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GENJOB_")}
        env["GENJOB_DATABASE_URL"] = url
        if args.src is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(args.src.resolve()), env.get("PYTHONPATH", "")])
        add_job(url, env, cwd)
        genjob(["--help"], env, cwd)  # untimed: the bytecode cache written, the files in the page cache
        load = os.getloadavg()[0]
        header = f"{'command':<16} {'fastest':>8} {'median':>8} {'slowest':>8} {'CPU':>8}"
        print(f"{header}   ({args.runs} runs each; CPU: the median's user + system)")
        for name, argv in COMMANDS.items():
            runs = [genjob(argv, env, cwd) for _ in range(args.runs)]
            walls = sorted(wall for wall, _ in runs)
            cpu = statistics.median(cpu for _, cpu in runs)
            median = statistics.median(walls)
            print(f"{name:<16} {walls[0]:>7.3f}s {median:>7.3f}s {walls[-1]:>7.3f}s {cpu:>7.3f}s")
        after = os.getloadavg()[0]
        print(f"load average (1 min): {load:.2f} before, {after:.2f} after, on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
