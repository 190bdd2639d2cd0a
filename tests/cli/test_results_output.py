"""``genjob results -o PATH`` by what PATH is: a file renamed into place, a symlink's target written (the
link kept), a FIFO and a character device streamed into, full and read-only filesystems in one line
with nothing left behind. Embedded mode with the scripted stand-in for the models."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from genjob.cli import main
from tests.support.prompts import write_jsonl

RECORDS = 40


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def job(embedded_env: str, scripted_models: None, tmp_path: Path) -> str:
    lines = [json.dumps({"prompt": f"p{i}", "id": f"q{i}"}) for i in range(RECORDS)]
    write_jsonl(tmp_path / "p.jsonl", lines)
    result = invoke("submit", "p.jsonl", "-m", "m", "--mode", "none")
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


def ids(text: str) -> list[str]:
    return [json.loads(line)["id"] for line in text.splitlines()]


def test_a_symlink_keeps_pointing_at_the_file_written(job: str, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "out.jsonl").write_text("old\n")
    (tmp_path / "link.jsonl").symlink_to(shared / "out.jsonl")
    (tmp_path / "dir-link").symlink_to(shared)
    assert invoke("results", job, "-o", "link.jsonl").exit_code == 0
    assert (tmp_path / "link.jsonl").is_symlink()
    assert ids((shared / "out.jsonl").read_text()) == [f"q{i}" for i in range(RECORDS)]
    assert invoke("results", job, "-o", "dir-link/new.jsonl").exit_code == 0
    assert (tmp_path / "dir-link").is_symlink() and len(ids((shared / "new.jsonl").read_text())) == RECORDS
    assert sorted(p.name for p in shared.iterdir()) == ["new.jsonl", "out.jsonl"]  # nothing left aside


def test_a_fifo_with_a_reader_gets_every_record(job: str, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = invoke("results", job, "-o", str(fifo))
    reader.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert ids(received[0].decode()) == [f"q{i}" for i in range(RECORDS)]


def test_a_character_device_stays_a_device(job: str, tmp_path: Path) -> None:
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    except PermissionError:
        pytest.skip("cannot make a device node here")
    for fmt in ("jsonl", "parquet"):
        assert invoke("results", job, "--format", fmt, "-o", str(null)).exit_code == 0
    assert stat.S_ISCHR(null.stat().st_mode)
    assert invoke("results", job, "-o", "-").stdout.count("\n") == RECORDS


def test_a_socket_is_refused_in_one_line(job: str, tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("sock")
        result = invoke("results", job, "-o", "sock")
    assert (result.exit_code, result.output) == (
        1,
        "Error: cannot write sock: not a regular file, a FIFO or a character device\n",
    )


def test_a_full_filesystem_is_one_line_and_leaves_nothing(job: str, small_tmpfs: Path) -> None:
    (small_tmpfs / "filler").write_bytes(b"x" * 60_000)
    target = small_tmpfs / "out.jsonl"
    result = invoke("results", job, "-o", str(target))
    assert (result.exit_code, result.output) == (
        1,
        f"Error: cannot write {target}: No space left on device\n",
    )
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["filler"]


def test_a_read_only_filesystem_is_one_line_and_leaves_nothing(job: str, small_tmpfs: Path) -> None:
    remounted = subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=False)
    if remounted.returncode:
        pytest.skip("cannot remount read-only here")
    target = small_tmpfs / "out.jsonl"
    result = invoke("results", job, "-o", str(target))
    assert (result.exit_code, result.output) == (1, f"Error: cannot write {target}: Read-only file system\n")
    assert list(small_tmpfs.iterdir()) == []


@pytest.mark.parametrize("command", [["results"], ["jobs"], ["status"]])
def test_a_closed_pipe_stops_quietly_with_141(
    job: str, embedded_env: str, tmp_path: Path, command: list[str]
) -> None:
    """`genjob results JOB | head -1`: the reader goes away before the output is written (here: at once)."""
    from tests.support.processes import GENJOB

    args = [*command, job] if command != ["jobs"] else command
    env = {**os.environ, "GENJOB_DATABASE_URL": embedded_env}
    process = subprocess.Popen(
        [GENJOB, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone
    stderr = process.stderr.read()
    assert (process.wait(timeout=60), stderr) == (141, b"")
