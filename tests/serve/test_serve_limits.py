"""Ad-hoc SQL bounded for real (a real ``attnbase serve`` on loopback, and ``attnbase sql``):
time, memory and bytes hold whatever the query does; one statement of an allowed type."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from serve_fixtures import ATTNBASE, Server

#: One 30-million-element list: DuckDB checks no interrupt while it builds it (~10 s, ~2 GB).
HUGE_LIST = "select range(30000000) as r"
#: A self cross join that runs until its time limit (interruptible, little memory).
CROSS_JOIN = ("select count(*) from row_stats a, row_stats b, row_stats c "
              "where a.entropy + b.entropy > c.entropy")


@pytest.fixture(scope="module")
def tight(serve_db):
    srv = Server(serve_db, "--sql-time-limit-ms", "3000", "--setting", "max_json_bytes=200000",
                 "--setting", "sql_memory_mb=400")
    yield srv
    srv.stop()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.slow
def test_uninterruptible_query_stopped_at_its_time_limit(serve_db):
    tight = Server(serve_db, "--setting", "sql_memory_mb=3000")  # time, not memory, stops it
    try:
        _stopped_at_time_limit(tight)
    finally:
        tight.stop()


def _stopped_at_time_limit(tight):
    for _ in range(3):  # warm: the pool's query processes started and ready
        assert httpx.post(tight.url + "/api/sql", json={"sql": "select 1"}).status_code == 200
    base = _rss_mb(tight.proc.pid)
    t0 = time.monotonic()
    r = httpx.post(tight.url + "/api/sql", json={"sql": HUGE_LIST, "timeout_ms": 1000},
                   timeout=30)
    took = time.monotonic() - t0
    print(f"stopped after {took:.2f} s; server RSS {base:.0f} -> {_rss_mb(tight.proc.pid):.0f} MB")
    assert r.status_code == 400 and "time limit of 1000 ms" in r.json()["detail"]
    assert took < 2.0, f"a 1 s limit answered after {took:.2f} s"
    assert _rss_mb(tight.proc.pid) < base + 200  # the query's memory was its process's
    # control: the server answers the next query at once (a fresh query process)
    r = httpx.post(tight.url + "/api/sql", json={"sql": "select 42 as a"}, timeout=30)
    assert r.status_code == 200 and r.json()["rows"] == [[42]]


@pytest.mark.slow
def test_query_stopped_at_its_memory_limit(tight):
    t0 = time.monotonic()
    r = httpx.post(tight.url + "/api/sql", json={"sql": HUGE_LIST}, timeout=30)
    took = time.monotonic() - t0
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert "memory limit of 400 MB" in detail and "\n" not in detail
    assert took < 3.0  # before the 3 s time limit: memory stopped it
    # control: a query within the limit under the same settings
    r = httpx.post(tight.url + "/api/sql", json={"sql": "select range(1000) as r"}, timeout=30)
    assert r.status_code == 200 and len(r.json()["rows"][0][0]) == 1000


def test_json_capped_in_bytes(tight):
    big = httpx.post(tight.url + "/api/sql", json={
        "sql": "select repeat('x', 1000) as s from range(5000)"}, timeout=30)
    assert big.status_code == 200 and big.json()["truncated"] is True
    assert 150_000 < len(big.content) <= 200_000 + 1000
    assert all(row == ["x" * 1000] for row in big.json()["rows"])
    # control: under the cap, the whole result
    small = httpx.post(tight.url + "/api/sql", json={
        "sql": "select repeat('x', 1000) as s from range(50)"}, timeout=30)
    assert small.json()["truncated"] is False and len(small.json()["rows"]) == 50
    # a single row over the cap: 400 naming it
    one = httpx.post(tight.url + "/api/sql", json={"sql": "select repeat('x', 300000) as s"},
                     timeout=30)
    assert one.status_code == 400 and "byte cap of 200000 bytes" in one.json()["detail"]


@pytest.mark.parametrize("sql, code, needle", [
    ("UPDATE EXTENSIONS", 403, "read-only: refusing a UPDATE statement"),
    ("select 1; select 2", 400, "one statement per query, got 2"),
    ("select * from duckdb_settings()", 403, "duckdb_settings is not available"),
    ("select * from duckdb_databases()", 403, "duckdb_databases is not available"),
    ("show databases", 403, "databases is not available"),
    ("select * from api_tokens", 403, "api_tokens is not available"),
    ("summarize api_tokens", 403, "api_tokens is not available"),
    ("select * from query('select 1')", 403, "query is not available"),
    ("explain select * from pragma_database_list", 403, "not available"),
])
def test_statements_refused_with_one_line(tight, sql, code, needle):
    with httpx.Client(base_url=tight.url, timeout=30) as c:  # one keep-alive connection
        r = c.post("/api/sql", json={"sql": sql})
        assert r.status_code == code and needle in r.json()["detail"], r.text
        assert "\n" not in r.json()["detail"]
        ok = c.post("/api/sql", json={"sql": "select 1 as a;"})  # control, same connection
        assert ok.status_code == 200 and ok.json()["rows"] == [[1]]


@pytest.mark.slow
def test_cli_stops_an_uninterruptible_query(serve_db):
    t0 = time.monotonic()
    p = subprocess.run([str(ATTNBASE), "sql", "--db", str(serve_db), HUGE_LIST, "--timeout-ms",
                        "1000", "--memory-mb", "3000"], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1
    assert p.stderr.startswith("error: query stopped at its time limit of 1000 ms"), p.stderr
    ran_ms = int(p.stderr.split("(ran ")[1].split(" ms")[0])
    assert ran_ms < 2000 and took < 10.0  # within the limit + 1 s; the rest is start-up
    p = subprocess.run([str(ATTNBASE), "sql", "--db", str(serve_db), HUGE_LIST, "--memory-mb",
                        "300"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error: query stopped at its memory limit "
                                                     "of 300 MB"), p.stderr
    p = subprocess.run([str(ATTNBASE), "sql", "--db", str(serve_db), "UPDATE EXTENSIONS"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1
    assert "refusing a UPDATE statement" in p.stderr
    p = subprocess.run([str(ATTNBASE), "sql", "--db", str(serve_db), "-f", "csv",
                        "select count(*) as n from runs"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stdout == "n\n2\n"  # control


DECOY = "decoy-in-the-working-directory-7c1e"


def test_sandbox_sees_only_the_database(serve_db, tmp_path):
    """Started from a working directory holding statistics-like decoys: a user query reads the
    database's statistics directories and nothing of the working directory."""
    for sub in ("row_stats", "col_stats"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "decoy.txt").write_text(DECOY)
    srv = Server(serve_db.resolve(), cwd=tmp_path)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for sub in ("row_stats", "col_stats"):
                for path in (f"{sub}/decoy.txt", f"{tmp_path}/{sub}/decoy.txt",
                             f"{sub}/../../{tmp_path.name}/{sub}/decoy.txt"):
                    r = c.post("/api/sql", json={"sql": f"select * from read_text('{path}')"})
                    assert DECOY not in r.text and r.status_code in (200, 403), r.text
                    assert r.status_code == 403 or r.json()["rows"] == []
            # control: the database's own statistics files are readable, absolute or relative
            own = sorted((serve_db / "row_stats").rglob("*.parquet"))[0].resolve()
            for path in (str(own), str(own.relative_to(serve_db.resolve()))):
                r = c.post("/api/sql", json={
                    "sql": f"select count(*) as n from read_parquet('{path}')"})
                assert r.status_code == 200 and r.json()["rows"][0][0] >= 0, r.text
            r = c.post("/api/sql", json={"sql": "select count(*) as n from row_stats"})
            assert r.status_code == 200 and r.json()["rows"][0][0] > 0
    finally:
        srv.stop()


def test_compare_is_bounded_and_deduplicated(server):
    from serve_fixtures import RUN

    with httpx.Client(base_url=server.url, timeout=30) as c:
        t0 = time.monotonic()
        r = c.get("/compare", params={"runs": ",".join([RUN] * 400)})
        took = time.monotonic() - t0
        assert r.status_code == 200 and r.text.count(f'<a href="/runs/{RUN}">') == 1
        assert took < 5.0, f"400 copies of one run took {took:.1f} s"
        many = ",".join(f"run-{i}" for i in range(13))
        r = c.get("/compare", params={"runs": many})
        assert r.status_code == 400 and "at most 12 distinct runs (got 13" in r.text
        # control: two distinct runs are compared
        r = c.get("/compare", params={"runs": f"{RUN},markup-run,{RUN}"})
        assert r.status_code == 200 and "key_norm_cv" in r.text


@pytest.mark.slow
def test_snapshots_private_and_cleaned(serve_db, tmp_path):
    """Snapshot copies live in one 0700 directory; a killed server's are removed by the next
    start; a refused start leaves nothing."""
    import os
    import signal
    import stat

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    root = tmp / f"attnbase-serve-{os.getuid()}"
    killed = Server(serve_db, env=env)
    httpx.get(killed.url + "/api/runs", timeout=30)
    copies = list(root.glob("pid-*/catalog-*.duckdb"))
    assert copies and stat.S_IMODE(root.stat().st_mode) == 0o700
    killed.stop(signal.SIGKILL)
    assert all(c.exists() for c in copies)  # control: a SIGKILL cleans nothing
    p = subprocess.run([str(ATTNBASE), "serve", "--db", str(serve_db), "--host", "0.0.0.0",
                        "--port", "1"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **env})
    assert p.returncode == 2 and "without an API token" in p.stderr
    assert list(root.iterdir()) == []  # the killed server's copies gone, none of its own


@pytest.mark.slow
def test_query_queue_wait_is_bounded(serve_db):
    """A query that finds every slot busy waits at most sql_queue_wait_ms, then 503 with
    Retry-After; the control, once the slot is free, is answered."""
    import threading

    srv = Server(serve_db, "--sql-time-limit-ms", "3000", "--setting", "sql_concurrency=1",
                 "--setting", "sql_queue_wait_ms=500")
    try:
        assert httpx.post(srv.url + "/api/sql", json={"sql": "select 1"}).status_code == 200
        busy = {}
        runaway = threading.Thread(target=lambda: busy.update(r=httpx.post(
            srv.url + "/api/sql", json={"sql": CROSS_JOIN}, timeout=30)))
        runaway.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        r = httpx.post(srv.url + "/api/sql", json={"sql": "select 1"}, timeout=30)
        took = time.monotonic() - t0
        assert r.status_code == 503 and r.headers.get("retry-after") == "1"
        assert "stayed busy for 0.5 s" in r.json()["detail"]
        assert 0.4 < took < 2.0, f"answered after {took:.2f} s"
        runaway.join(30)
        assert busy["r"].status_code == 400  # stopped at its 3 s limit
        r = httpx.post(srv.url + "/api/sql", json={"sql": "select 2 as b"}, timeout=30)
        assert r.status_code == 200 and r.json()["rows"] == [[2]]
    finally:
        srv.stop()
