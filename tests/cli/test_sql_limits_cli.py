"""``attnbase sql`` under the query watchdog: --timeout-ms and Ctrl-C (exit 130 within 1 s)."""

from __future__ import annotations

import signal
import subprocess
import time

from cli_paths import ATTNBASE

RUNAWAY = "select count(*) from range(1000000) a, range(1000000) b where a.range > b.range"


def test_timeout_stops_a_runaway_query(cli, fake_db):
    t0 = time.monotonic()
    code, out, err = cli("sql", "--db", fake_db.path, RUNAWAY, "--timeout-ms", "300")
    took = time.monotonic() - t0
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("error: query stopped at its time limit of 300 ms")
    assert took < 2.0
    code, out, _ = cli("sql", "--db", fake_db.path, "SELECT count(*) AS n FROM runs", "-f", "csv",
                       "--timeout-ms", "300")
    assert code == 0 and out == "n\n1\n"  # a quick query under the same limit: answered


def _query_process_started(p: subprocess.Popen, within_s: float = 60.0) -> None:
    """Wait until the command has started its query process (start-up takes longer on a
    loaded machine than any fixed sleep)."""
    import psutil

    deadline = time.monotonic() + within_s
    while not psutil.Process(p.pid).children():
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)  # into the query


def test_ctrl_c_stops_a_running_query(fake_db):
    p = subprocess.Popen([str(ATTNBASE), "sql", "--db", str(fake_db.path), RUNAWAY],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _query_process_started(p)
        assert p.poll() is None
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=10)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and out == ""
    assert err.startswith("query interrupted (Ctrl-C)") and err.count("\n") == 1
    assert "Traceback" not in err
    assert took < 1.0, f"Ctrl-C took {took:.2f} s"


def test_a_ctrl_c_duckdb_swallowed_still_stops_the_query(fake_db):
    """DuckDB's client turns a KeyboardInterrupt during a statement that then finishes into
    nothing: the record of the Ctrl-C stops the query that follows, at once."""
    import os

    import pytest

    from attnbase.errors import QueryInterrupted
    from attnbase.interrupt import handle_ctrl_c
    from attnbase.warehouse.sandbox.sql import user_query
    from attnbase.warehouse.sandbox.sqlproc import Limits

    limits = Limits(time_s=30, memory_mb=2000, max_bytes=1 << 20)
    with handle_ctrl_c():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            pass  # what DuckDB's client did with it
        t0 = time.monotonic()
        with pytest.raises(QueryInterrupted, match="interrupted"):
            user_query(fake_db, RUNAWAY, limits)
        assert time.monotonic() - t0 < 10
    # negative control: with no Ctrl-C the same limits answer a quick query
    assert user_query(fake_db, "select 42 as x", limits).table.column("x").to_pylist() == [42]


def test_query_arrow_caps(fake_db):
    """The service's caps, on the function both faces share: rows cut (truncated), bytes refused."""
    import pytest

    from attnbase.errors import QueryLimitError
    from attnbase.warehouse.sandbox.sql import query_arrow

    r = query_arrow(fake_db, "select * from range(100000)", max_rows=10)
    assert r.table.num_rows == 10 and r.truncated
    r = query_arrow(fake_db, "select * from range(10)", max_rows=10)
    assert r.table.num_rows == 10 and not r.truncated
    with pytest.raises(QueryLimitError, match="byte cap of 1000 bytes"):
        query_arrow(fake_db, "select * from range(100000)", max_bytes=1000)
    with pytest.raises(QueryLimitError, match="time limit of 200 ms"):
        query_arrow(fake_db, RUNAWAY, timeout_s=0.2)
