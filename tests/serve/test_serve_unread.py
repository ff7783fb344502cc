"""Answers bounded by the bytes sent, and clients that never read them (a real ``attnbase
serve`` on loopback, raw sockets): the server's memory stays bounded, the byte cap counts the
encoded answer, and a client that stops reading is disconnected."""

from __future__ import annotations

import io
import json
import socket
import time

import httpx
import psutil
import pytest

from serve_fixtures import Server

#: About 60 MB of JSON (10,000 rows of 6,000 characters), the issue's answer size.
BIG_JSON = "select repeat('x', 6000) as s from range(10000)"
#: About 20 MB of JSON.
MID_JSON = "select repeat('x', 2000) as s from range(10000)"
CAP = 2_000_000


def _unread(port: int, sql: str, fmt: str = "json") -> socket.socket:
    """A socket that sends one query and reads nothing (a 4 KiB receive buffer)."""
    body = json.dumps({"sql": sql, "format": fmt}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(f"POST /api/sql HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              f"content-length: {len(body)}\r\n\r\n".encode() + body)
    return s


def _rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


@pytest.fixture(scope="module")
def capped(serve_db):
    srv = Server(serve_db, "--setting", f"max_stream_bytes={CAP}")
    yield srv
    srv.stop()


def test_unread_answers_bounded_in_server_memory(capped):
    """12 sockets each asking for 60 MB of JSON and never reading: before, the server held
    every encoded answer and its copy in the socket's buffer (RSS +1,017 MB); now at most
    ``sql_concurrency`` results, streamed, until the client is dropped."""
    for _ in range(3):  # warm: the query processes started
        assert httpx.post(capped.url + "/api/sql", json={"sql": "select 1"}).status_code == 200
    pid = capped.proc.pid
    before = peak = _rss_mb(pid)
    socks = [_unread(capped.port, BIG_JSON) for _ in range(12)]
    try:
        t_end = time.monotonic() + 6.0
        while time.monotonic() < t_end:
            peak = max(peak, _rss_mb(pid))
            time.sleep(0.1)
    finally:
        for s in socks:
            s.close()
    print(f"12 unread 60 MB JSON answers: server RSS {before:.0f} -> peak {peak:.0f} MB")
    assert peak - before < 400, f"RSS grew {peak - before:.0f} MB"
    # control: a client that reads gets the whole answer (streamed past 1 MiB)
    r = httpx.post(capped.url + "/api/sql", json={"sql": BIG_JSON}, timeout=60)
    assert r.status_code == 200 and r.json()["truncated"] is False
    assert len(r.json()["rows"]) == 10_000 and len(r.content) > 60_000_000


def _read_all(s: socket.socket) -> bytes:
    got = bytearray()
    s.settimeout(10)
    try:
        while chunk := s.recv(1 << 20):
            got += chunk
    except ConnectionResetError:
        pass
    return bytes(got)


@pytest.mark.slow  # ~20 s: it waits out the write deadline
def test_client_that_stops_reading_is_disconnected(serve_db):
    srv = Server(serve_db, "--setting", "send_timeout_s=1.5")
    try:
        # control: a client reading at once gets all of it, ended properly (the last chunk)
        t0 = time.monotonic()
        s = _unread(srv.port, MID_JSON)
        try:
            got = _read_all(s)
        finally:
            s.close()
        took = time.monotonic() - t0
        assert len(got) > 20_000_000 and got.endswith(b"\r\n0\r\n\r\n")
        s = _unread(srv.port, MID_JSON)
        try:
            time.sleep(max(3.0, 2 * took + 1.5))  # the answer made, then send_timeout_s passed
            got = _read_all(s)  # what the kernel's buffers held, then the connection's end
        finally:
            s.close()
        assert got.startswith(b"HTTP/1.1 200") and len(got) < 10_000_000, len(got)
    finally:
        srv.stop()


def _csv(sql: str, url: str, fmt: str = "csv") -> httpx.Response:
    return httpx.post(url + "/api/sql", json={"sql": sql, "format": fmt}, timeout=60)


@pytest.mark.parametrize("fmt", ["csv", "arrow", "parquet"])
def test_stream_cap_counts_the_bytes_sent(capped, fmt):
    """A CSV of 110,000 rows is 1.79 MB of Arrow data but 2.3 MB encoded: before, all of it
    was sent under a 2 MB cap with ``X-Attnbase-Truncated: false``; now the rows that fit."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    def frame(r):
        if fmt == "csv":
            return pl.read_csv(io.BytesIO(r.content))
        if fmt == "arrow":
            return pl.from_arrow(pa.ipc.open_stream(r.content).read_all())
        return pl.from_arrow(pq.read_table(pa.BufferReader(r.content)))

    n = 110_000 if fmt == "csv" else 200_000  # Arrow and Parquet: the Arrow cap cuts too
    r = _csv(f"select range as a, range / 3 as b from range({n})", capped.url, fmt)
    assert r.status_code == 200, r.text
    df = frame(r)
    assert len(r.content) <= CAP and r.headers["x-attnbase-truncated"] == "true"
    assert 0 < df.height < n and df["a"].to_list() == list(range(df.height))  # a prefix
    # control: under the cap, streamed (over 1 MiB) and whole, every row, not truncated
    for m in (90_000, 1000):
        r = _csv(f"select range as a, range / 3 as b from range({m})", capped.url, fmt)
        assert r.status_code == 200 and r.headers["x-attnbase-truncated"] == "false"
        assert frame(r)["a"].to_list() == list(range(m))


def test_row_over_the_stream_cap_is_one_line(capped):
    r = _csv(f"select repeat('x', {CAP + 10}) as s", capped.url)
    assert r.status_code == 400 and "\n" not in r.json()["detail"]
    assert "byte cap of 2000000 bytes" in r.json()["detail"]
    r = _csv("select repeat('x', 1000) as s", capped.url)  # control
    assert r.status_code == 200 and r.text == "\"s\"\n\"" + "x" * 1000 + "\"\n"
