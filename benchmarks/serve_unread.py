"""Benchmark of ``attnbase serve`` under clients that never read their answers (not a test).

    python benchmarks/serve_unread.py [--db DIR] [--sockets 12] [--format json] [--wait 8]
                                      [--setting NAME=VALUE ...]

Builds the service tests' database (tests/serve/serve_fixtures.py) in DIR (default a temporary
directory; reused when it exists), starts ``attnbase serve`` on it, opens ``--sockets`` raw
loopback sockets (receive buffer 4 KiB) that each send one ``POST /api/sql`` asking for about
60 MB (JSON: 10,000 rows of 6,000 characters; CSV/Arrow/Parquet: 60,000 rows of 1,000) and
never read, and prints the server's resident set before, its peak while they wait (sampled every
0.1 s for ``--wait`` seconds) and after they are closed; then one client that reads gets the
same answer in full (its size and time).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))

from serve_fixtures import Server, build_database  # noqa: E402

QUERIES = {"json": "select repeat('x', 6000) as s from range(10000)",
           "csv": "select repeat('x', 1000) as s from range(60000)"}


def request(port: int, fmt: str) -> bytes:
    body = json.dumps({"sql": QUERIES.get(fmt, QUERIES["csv"]), "format": fmt}).encode()
    return (f"POST /api/sql HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: "
            f"application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


def unread_socket(port: int, fmt: str) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(request(port, fmt))
    return s


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", type=Path)
    ap.add_argument("--sockets", type=int, default=12)
    ap.add_argument("--format", default="json", choices=("json", "csv", "arrow", "parquet"))
    ap.add_argument("--wait", type=float, default=8.0)
    ap.add_argument("--setting", action="append", default=[])
    a = ap.parse_args()
    db = a.db or Path(tempfile.mkdtemp(prefix="attnbase-unread-")) / "db"
    if not (db / "catalog.duckdb").exists():
        build_database(db)
    args = [x for s in a.setting for x in ("--setting", s)]
    srv = Server(db, *args)
    try:
        import httpx

        for _ in range(3):  # warm: query processes started
            httpx.post(srv.url + "/api/sql", json={"sql": "select 1"}, timeout=30)
        pid = srv.proc.pid
        before = rss_mb(pid)
        socks = [unread_socket(srv.port, a.format) for _ in range(a.sockets)]
        peak, t_end = before, time.monotonic() + a.wait
        while time.monotonic() < t_end:
            peak = max(peak, rss_mb(pid))
            time.sleep(0.1)
        for s in socks:
            s.close()
        time.sleep(1.0)
        after = rss_mb(pid)
        t0 = time.monotonic()
        r = httpx.post(srv.url + "/api/sql", json={"sql": QUERIES.get(a.format, QUERIES["csv"]),
                                                   "format": a.format}, timeout=60)
        took = time.monotonic() - t0
        print(f"{a.sockets} unread {a.format} sockets: server RSS {before:.0f} -> peak "
              f"{peak:.0f} MB (+{peak - before:.0f}); {after:.0f} MB 1 s after they closed; "
              f"a reading client: {r.status_code}, {len(r.content)} bytes in {took:.2f} s, "
              f"truncated={r.headers.get('x-attnbase-truncated')}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
