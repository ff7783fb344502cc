"""Deadlines for slow clients, with real sockets on a real ``attnbase serve`` (loopback)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from serve_fixtures import Server

HEAD_S = BODY_S = 1.5
#: What :func:`_closed_after` appends when the server's close reset the connection (the kernel
#: answers a close with unread bytes by a reset, which may discard the response before it is read)
RESET = b"<reset>"
CAP = 6


@pytest.fixture(scope="module")
def strict(serve_db):
    srv = Server(serve_db, "--setting", f"head_timeout_s={HEAD_S}", "--setting",
                 f"body_timeout_s={BODY_S}", "--setting", f"max_connections={CAP}",
                 "--setting", "keep_alive_s=2")
    yield srv
    srv.stop()


def _closed_after(sock: socket.socket, trickle: bytes = b"", every: float = 0.5,
                  limit: float = 8.0) -> tuple[float, bytes]:
    """Seconds until the server closes ``sock`` (sending ``trickle`` one byte per ``every``),
    and what it sent; ``limit`` bounds the wait."""
    t0 = time.monotonic()
    got, i = b"", 0
    sock.settimeout(every)
    while time.monotonic() - t0 < limit:
        try:
            chunk = sock.recv(4096)
            if not chunk:
                return time.monotonic() - t0, got
            got += chunk
        except socket.timeout:
            pass
        except ConnectionResetError:  # closed while our trickled bytes were unread
            return time.monotonic() - t0, got + RESET
        if trickle:
            try:
                sock.sendall(trickle[i % len(trickle):i % len(trickle) + 1])
                i += 1
            except OSError:
                return time.monotonic() - t0, got
    return float("inf"), got


def test_trickled_head_is_cut_at_the_deadline(strict):
    with socket.create_connection(("127.0.0.1", strict.port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\n")
        took, got = _closed_after(s, trickle=b"X-Slow: a\r\n")
    assert took < HEAD_S + 1.0, f"a trickling client held its connection {took:.1f} s"
    assert got.startswith(b"HTTP/1.1 408") or got == RESET
    # control: a whole request is answered
    assert httpx.get(strict.url + "/healthz").status_code == 200


def test_silent_connection_is_closed(strict):
    with socket.create_connection(("127.0.0.1", strict.port)) as s:
        took, got = _closed_after(s)
    assert took < HEAD_S + 1.0 and got.startswith(b"HTTP/1.1 408")


def test_late_body_is_cut_at_the_deadline(strict):
    with socket.create_connection(("127.0.0.1", strict.port)) as s:
        s.sendall(b"POST /api/sql HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"sql\": ")
        took, _ = _closed_after(s, trickle=b" ", every=0.5)
    assert took < BODY_S + 1.0, f"a trickled body held its connection {took:.1f} s"
    # control: the same request sent whole is answered, on a keep-alive connection that stays
    # open between two requests 1 s apart (under keep_alive_s)
    with httpx.Client(base_url=strict.url) as c:
        assert c.post("/api/sql", json={"sql": "select 1 as a"}).status_code == 200
        time.sleep(1.0)
        assert c.post("/api/sql", json={"sql": "select 2 as a"}).json()["rows"] == [[2]]


def test_open_connections_are_capped(strict):
    held = []
    try:
        for _ in range(CAP):
            held.append(socket.create_connection(("127.0.0.1", strict.port)))
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", strict.port)) as extra:
            took, got = _closed_after(extra, limit=3.0)
        assert got.startswith(b"HTTP/1.1 503") and took < 1.0
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert httpx.get(strict.url + "/healthz").status_code == 200  # control: room again


def test_oversized_head_refused(strict):
    with socket.create_connection(("127.0.0.1", strict.port)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        for _ in range(20):  # 200 KB of headers, under the deadline
            try:
                s.sendall(b"X-Pad: " + b"a" * 10_000 + b"\r\n")
            except OSError:
                break
        took, got = _closed_after(s, limit=3.0)
    assert got.startswith(b"HTTP/1.1 431") or got == RESET, got[:80]
    # control: a request with an ordinary header is answered
    assert httpx.get(strict.url + "/healthz", headers={"X-Pad": "a" * 1000}).status_code == 200


def test_large_body_on_keep_alive_is_not_a_large_head(strict):
    """A body near max_body_bytes (64 KiB) arriving with its head counts as a body, not as the
    next request's head: answered, twice on one keep-alive connection (the guard sees where a
    message ends through its own parser)."""
    sql = "select 1 as a -- " + "x" * 60_000
    with httpx.Client(base_url=strict.url) as c:
        for _ in range(2):
            r = c.post("/api/sql", json={"sql": sql})
            assert r.status_code == 200 and r.json()["rows"] == [[1]]
