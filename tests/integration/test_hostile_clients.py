"""`genjob api` holds up to hostile clients: stalled or trickled headers are cut off within the header
timeout while others are served; a stalled body answers 408, and so does one slower than the minimum
rate; large uploads beyond the concurrent cap (or one key's half of it) answer 503, so the spool on disk
stays within max uploads × the size limit, while small uploads, which take no slot, are served."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import (
    GENJOB,
    ServiceProcess,
    child_pids,
    free_port,
    service_env,
    wait_until_serving,
)
from tests.support.waiting import NOT_UP, wait_for

pytestmark = pytest.mark.integration

KEY, OTHER_KEY = "hostile-key-0123456789", "other-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
UPLOAD_LIMIT = 2 << 20  # over the 1 MiB an upload keeps in memory: the rest spools to disk


@pytest.fixture
def api(pg_url: str, queue_name: str, tmp_path: Path) -> Iterator[tuple[int, Path, int]]:
    """A live API with short timeouts, two upload slots (one per key), two keys and its spool in a folder
    of its own."""
    port = free_port()
    spool = tmp_path / "spool"
    spool.mkdir()
    env = service_env(
        pg_url,
        queue_name,
        api_keys=f"{KEY},{OTHER_KEY}",
        api_body_grace_s="2",
        api_header_timeout_s="4",
        api_body_timeout_s="3",
        api_max_uploads="2",
        max_upload_bytes=str(UPLOAD_LIMIT),
        models='{"m": "some/model"}',
    )
    env["TMPDIR"] = str(spool)
    with ServiceProcess([GENJOB, "api", "--port", str(port)], env, tmp_path / "api.log") as process:
        wait_until_serving(f"http://127.0.0.1:{port}")
        yield port, spool, process.pid


def spooled_bytes(pid: int, spool: Path) -> int:
    """Bytes in the temporary files the API's processes hold open under ``spool`` (they are unlinked
    at once, so only their open descriptors show them)."""
    pids, total = [pid, *child_pids(pid)], 0
    for process in pids:
        for fd in Path(f"/proc/{process}/fd").glob("*"):
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith(str(spool)):
                    total += fd.stat().st_size
    return total


def uploads_receiving(client: httpx.Client) -> float:
    """The API's gauge of uploads being received now."""
    families = text_string_to_metric_families(client.get("/metrics").text)
    return next(f.samples[0].value for f in families if f.name == "genjob_api_uploads_receiving")


def closed_after(sock: socket.socket, started: float, limit: float) -> float:
    """Seconds until the server closed ``sock`` (reading whatever it sent first)."""
    sock.settimeout(limit)
    try:
        while sock.recv(4096):
            pass
    except (ConnectionResetError, TimeoutError):
        pass
    return time.monotonic() - started


def test_stalled_and_trickled_headers_are_cut_off_while_others_are_served(api: tuple[int, Path]) -> None:
    port, _, _ = api
    started = time.monotonic()
    stalled = []
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthoriz")  # half a header, then nothing
        stalled.append(sock)
    trickle = socket.create_connection(("127.0.0.1", port))
    stop = threading.Event()

    def drip() -> None:  # a byte a second, never finishing the headers: a slowloris
        for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 60:
            if stop.wait(1.0):
                return
            try:
                trickle.sendall(bytes([byte]))
            except OSError:
                return

    threading.Thread(target=drip, daemon=True).start()
    served = 0
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=5) as client:
        while time.monotonic() - started < 6:  # normal requests keep being answered meanwhile
            assert client.get("/v1/jobs").status_code == 200
            served += 1
    cut = [closed_after(sock, started, 30) for sock in stalled]
    trickled = closed_after(trickle, started, 30)
    stop.set()
    assert served >= 5
    assert max(cut) < 30 and trickled < 30, (cut, trickled)
    assert max(cut) < 10 and trickled < 10  # the 4 s header timeout, with room for a busy machine


def test_a_stalled_body_answers_408(api: tuple[int, Path]) -> None:
    port, _, _ = api
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n"
        b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 5000\r\n\r\n--b\r\n"
    )
    started = time.monotonic()
    sock.settimeout(30)
    answer = b""
    while chunk := sock.recv(4096):  # the server closes the connection after its answer
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"GENJOB_API_BODY_TIMEOUT_S" in answer
    assert time.monotonic() - started < 15


def held_upload(port: int, key: str) -> socket.socket:
    """A chunked multipart upload that sends its part's header and 1.2 MiB at once (past what an upload
    keeps in memory: it takes a slot), then keeps its connection for more."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() + b"\r\n"
        b"Content-Type: multipart/form-data; boundary=b\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    part = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
    start = part + (b'{"prompt": "' + b"x" * 1000 + b'"}\n') * 1200
    sock.sendall(b"%x\r\n%s\r\n" % (len(start), start))
    return sock


def keep_sending(
    holders: list[socket.socket], stop: threading.Event, flood: threading.Event | None = None
) -> None:
    """In a thread until ``stop``: a trickle into each held upload (10 KiB/s each, over the minimum rate,
    far under the size limit for a test's wait), so it holds its slot however slowly a busy machine
    serves it; once ``flood`` is set, 640 KiB/s each, past the limit."""
    trickle = b'{"prompt": "' + b"x" * 1024 + b'"}\n'
    block = b'{"prompt": "' + b"x" * (64 << 10) + b'"}\n'

    def send() -> None:
        while not stop.wait(0.1):
            data = block if flood is not None and flood.is_set() else trickle
            for sock in holders:
                with contextlib.suppress(OSError):
                    sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))

    threading.Thread(target=send, daemon=True).start()


def test_uploads_beyond_the_cap_get_503_and_the_spool_stays_bounded(api: tuple[int, Path]) -> None:
    port, spool, pid = api
    holders = [held_upload(port, key) for key in (KEY, OTHER_KEY)]  # one slot each: both slots taken
    stop, flood = threading.Event(), threading.Event()
    keep_sending(holders, stop, flood)
    large = b'{"a": "' + b"y" * (1100 << 10) + b'"}\n'  # over 1 MiB: it needs a slot
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=10) as client:
            wait_for(
                lambda: uploads_receiving(client) == 2,
                timeout=30,
                what="both held uploads to be received",
                tolerate=NOT_UP,
            )
            third = client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("c.jsonl", large)})
            assert third.status_code == 503, third.text
            assert third.json()["error"]["code"] == "too_many_uploads"
            assert third.headers["retry-after"] == "5"
            assert third.headers["connection"] == "close"  # its body was not read: a new connection next
            small = client.post(  # a one-line upload takes no slot: served while both are held
                "/v1/files", data={"purpose": "batch"}, files={"file": ("c.jsonl", b'{"a": 1}\n')}
            )
            assert small.status_code == 200, small.text
            flood.set()
            peak = 0

            def cut_off() -> bool:  # the held uploads grow past the limit and are cut off (413)
                nonlocal peak
                peak = max(peak, spooled_bytes(pid, spool))
                return uploads_receiving(client) == 0

            wait_for(cut_off, timeout=60, what="the held uploads to be cut off at the limit", tolerate=NOT_UP)
            assert 0 < peak <= 2 * (UPLOAD_LIMIT + (64 << 10))
            assert all(sock.recv(4096).startswith(b"HTTP/1.1 413") for sock in holders)
            again = client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("c.jsonl", large)})
            assert again.status_code == 200  # the slots are free again once they are cut off
    finally:
        stop.set()
        for sock in holders:
            sock.close()


def test_one_key_holds_half_the_slots_and_a_too_slow_upload_is_cut(api: tuple[int, Path]) -> None:
    port, _, _ = api
    large = b'{"a": "' + b"y" * (1100 << 10) + b'"}\n'
    trickling = [held_upload(port, KEY) for _ in range(4)]  # four on one key: one of them gets a slot
    stop = threading.Event()
    keep_sending(trickling, stop)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=10) as client:
            wait_for(
                lambda: uploads_receiving(client) == 1,
                timeout=30,
                what="one held upload, the others refused",
                tolerate=NOT_UP,
            )
            one_line = client.post(
                "/v1/jobs",
                params={"model": "m"},
                content=b'{"prompt": "a"}\n',
                headers={"Authorization": f"Bearer {OTHER_KEY}", "Content-Type": "application/jsonl"},
            )
            assert one_line.status_code == 201, one_line.text
            mine = client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("c.jsonl", large)})
            assert (mine.status_code, mine.json()["error"]["message"]) == (
                503,
                "this API key already has 1 large uploads being received: retry shortly",
            )
            other = client.post(
                "/v1/files",
                data={"purpose": "batch"},
                files={"file": ("c.jsonl", large)},
                headers={"Authorization": f"Bearer {OTHER_KEY}"},
            )
            assert other.status_code == 200, other.text
    finally:
        stop.set()
        for sock in trickling:
            sock.close()
    slow = socket.create_connection(("127.0.0.1", port))  # declares 1.5 MiB (a slot at once), sends 200 B/s
    slow.sendall(
        b"POST /v1/jobs?model=m HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + OTHER_KEY.encode() + b"\r\n"
        b"Content-Type: application/jsonl\r\nContent-Length: 1572864\r\n\r\n"
    )
    started, answer = time.monotonic(), b""
    slow.settimeout(0.5)
    while time.monotonic() - started < 20 and not answer:
        with contextlib.suppress(OSError):
            slow.sendall(b"x" * 100)
        with contextlib.suppress(TimeoutError):
            answer = slow.recv(4096)
    slow.settimeout(5)
    with contextlib.suppress(OSError):
        while more := slow.recv(4096):  # the server closes the connection after its answer
            answer += more
    slow.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"GENJOB_API_BODY_MIN_RATE" in answer
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=10) as client:
        wait_for(
            lambda: uploads_receiving(client) == 0,
            timeout=10,
            what="the slow upload's slot to be free",
            tolerate=NOT_UP,
        )
