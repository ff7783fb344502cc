"""A team database's write path: the write lock kept on one PostgreSQL session per process,
and a batch's ledger mark that only inserts its statistics files' rows."""

from __future__ import annotations

import threading
import time

import psycopg
from fakes import fake_config, fake_info, make_batch

from attnbase.warehouse import Database


def _lock_holder(url: str) -> int | None:
    """The server PID of the session holding the catalog's write lock, or None."""
    with psycopg.connect(Database(url).catalog.url.conninfo(), autocommit=True) as pg:
        row = pg.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                         "AND objid = hashtext('attnbase:catalog-write')::oid").fetchone()
    return None if row is None else int(row[0])


def test_writing_transactions_of_a_process_take_the_lock_on_one_kept_session(team):
    url, _ = team
    db = Database(url)
    holders = []
    for i in range(3):
        with db.transaction(stats=False) as con:
            holders.append(_lock_holder(url))
            con.execute("INSERT INTO run_metrics VALUES ('x', ?, 1.0)", [f"m{i}"])
    assert None not in holders
    assert len(set(holders)) == 1, holders  # a new connection per transaction: 3 PIDs
    assert _lock_holder(url) is None  # given back after each


def test_two_threads_of_one_process_still_take_turns(team):
    """Negative control: session locks are reentrant, so each lock held at once has a session
    of its own and a second thread waits for the first."""
    url, _ = team
    db = Database(url)
    inside, events = threading.Event(), []

    def first():
        with db.transaction(stats=False):
            events.append(("first in", time.monotonic()))
            inside.set()
            time.sleep(0.5)
            events.append(("first out", time.monotonic()))

    t = threading.Thread(target=first)
    t.start()
    inside.wait(30)
    with db.transaction(stats=False):
        events.append(("second in", time.monotonic()))
    t.join()
    assert [e for e, _ in events] == ["first in", "first out", "second in"]


def _statements(url: str, write) -> list[str]:
    """The SQL statements this process's catalog instance ran while ``write()`` ran (DuckDB's
    query log)."""
    inst = Database(url).catalog._instance()
    inst.execute("CALL truncate_duckdb_logs()")
    inst.execute("CALL enable_logging('QueryLog')")
    try:
        write()
    finally:
        inst.execute("CALL disable_logging()")
    return [m for (m,) in inst.execute("SELECT message FROM duckdb_logs WHERE type = 'QueryLog' "
                                      "ORDER BY timestamp").fetchall()]


def _stat_files(url: str, run: str) -> list[tuple]:
    with Database(url).connect(read_only=True, stats=False) as con:
        return con.execute("SELECT batch, table_name, path FROM stat_files WHERE run_id = ? "
                           "ORDER BY batch, table_name", [run]).fetchall()


def _deletes(statements: list[str]) -> int:
    return sum(s.lstrip().upper().startswith("DELETE FROM STAT_FILES") for s in statements)


def test_a_batch_mark_only_inserts_the_rows_of_its_files(team):
    import pickle

    from attnbase.warehouse.runs.writer import RunWriter

    url, _ = team
    info, cfg = fake_info(), fake_config(n_seqs=4, batch_size=2)
    w = RunWriter.open(Database(url), "m", cfg.run_spec(info, corpus="default", corpus_hash="c"))
    ran = _statements(url, lambda: w.write(make_batch(info, cfg, 0)))
    assert any(s.startswith("INSERT INTO stat_files") for s in ran), ran
    assert _deletes(ran) == 0, ran
    # negative control: the same batch marked again replaces its rows (a DELETE, then the
    # INSERT) and never lists a path twice
    ran = _statements(url, lambda: w.write(make_batch(info, cfg, 0)))
    assert _deletes(ran) == 1, ran
    rows = _stat_files(url, "m")
    assert len(rows) == len(set(rows)) == 2, rows
    # a writer sent to another process knows nothing of what is listed: it deletes first
    sent = pickle.loads(pickle.dumps(w))
    assert _deletes(_statements(url, lambda: sent.write(make_batch(info, cfg, 1)))) == 1
    assert len(_stat_files(url, "m")) == 4
    w.finish()
