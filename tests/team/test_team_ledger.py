"""A team database's write path: the write lock kept on one PostgreSQL session per process,
and the ledger in PostgreSQL tables of its own (a batch mark waits for no other writer)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
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


def _stat_files(url: str, run: str) -> list[tuple]:
    with Database(url).connect(read_only=True, stats=False) as con:
        return con.execute("SELECT batch, table_name, path FROM stat_files WHERE run_id = ? "
                           "ORDER BY batch, table_name", [run]).fetchall()


def _pg(url: str, sql: str, params=None) -> list[tuple]:
    with psycopg.connect(Database(url).catalog.url.conninfo(), autocommit=True) as pg:
        return pg.execute(sql, params).fetchall()


def _snapshots(url: str) -> int:
    return _pg(url, "SELECT max(snapshot_id) FROM ducklake_snapshot")[0][0]


def test_a_batch_mark_is_a_postgresql_transaction_that_waits_for_no_writer(team):
    """The mark goes to the ledger's own tables: it takes no write lock and makes no DuckLake
    snapshot, so a writer holding the catalog (here: for 3 s) delays no other run's batch."""
    from attnbase.warehouse.runs.writer import RunWriter

    url, _ = team
    db = Database(url)
    info, cfg = fake_info(), fake_config(n_seqs=4, batch_size=2)
    w = RunWriter.open(db, "m", cfg.run_spec(info, corpus="default", corpus_hash="c"))
    held, done = threading.Event(), threading.Event()

    def hold():
        with Database(url).catalog.write_lock():
            held.set()
            done.wait(3)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(30)
    snaps, version = _snapshots(url), _pg(url, "SELECT n FROM attnbase_ledger.version")[0][0]
    t0 = time.monotonic()
    w.write(make_batch(info, cfg, 0))
    took = time.monotonic() - t0
    # negative control: a catalog transaction waits for the lock, and fails after its timeout
    from attnbase.errors import CatalogLockedError

    short = Database(url, lock_timeout=0.5)
    try:
        with short.transaction(stats=False) as con:
            con.execute("INSERT INTO run_metrics VALUES ('x', 'y', 1.0)")
        waited = None
    except CatalogLockedError as err:
        waited = str(err)
    done.set()
    t.join()
    assert took < 1.5, took
    assert waited is not None and "being written by another process" in waited
    assert _snapshots(url) == snaps  # no DuckLake commit
    assert _pg(url, "SELECT n FROM attnbase_ledger.version")[0][0] == version + 1
    assert _pg(url, "SELECT batch, status FROM attnbase_ledger.batches WHERE run_id = 'm' "
                    "ORDER BY batch") == [(0, "complete"), (1, "pending")]
    assert [r[0] for r in _stat_files(url, "m")] == [0, 0]  # the lake's view reads them
    w.write(make_batch(info, cfg, 1))
    w.finish()


def test_a_batch_marked_again_never_lists_a_path_twice(team):
    import pickle

    from attnbase.warehouse.runs.writer import RunWriter

    url, _ = team
    info, cfg = fake_info(), fake_config(n_seqs=4, batch_size=2)
    w = RunWriter.open(Database(url), "m", cfg.run_spec(info, corpus="default", corpus_hash="c"))
    w.write(make_batch(info, cfg, 0))
    w.write(make_batch(info, cfg, 0))
    rows = _stat_files(url, "m")
    assert len(rows) == len(set(rows)) == 2, rows
    sent = pickle.loads(pickle.dumps(w))  # a writer sent to another process
    sent.write(make_batch(info, cfg, 1))
    sent.write(make_batch(info, cfg, 1))
    assert len(_stat_files(url, "m")) == 4
    w.finish()


def test_a_team_database_with_its_ledger_in_the_lake_is_moved_in_once(team):
    """A team database made before the ledger moved: ``batches`` and ``stat_files`` tables of
    the lake. The next process moves their rows into PostgreSQL, once, and the views read
    them; a move stopped before its last step is done again from the start."""
    from attnbase.warehouse.catalog import pg_ledger
    from attnbase.warehouse.catalog.ducklake import DuckLakeBackend
    from attnbase.warehouse.runs.writer import RunWriter

    url, _ = team
    info, cfg = fake_info(), fake_config(n_seqs=4, batch_size=2)
    w = RunWriter.open(Database(url), "old", cfg.run_spec(info, corpus="default",
                                                           corpus_hash="c"))
    for b in range(2):
        w.write(make_batch(info, cfg, b))
    w.finish()
    before = (_rows(url, "batches"), _rows(url, "stat_files"))
    assert len(before[0]) == 2 and len(before[1]) == 4
    # the layout of before: the rows in lake tables, no setting, nothing in PostgreSQL
    con = Database(url).catalog._cursor()
    try:
        con.execute("BEGIN TRANSACTION")
        for name in ("batches", "stat_files"):
            con.execute(f"CREATE TABLE lake.main.{name}_old AS SELECT * FROM lake.main.{name}")
            con.execute(f"DROP VIEW lake.main.{name}")
            con.execute(f"ALTER TABLE lake.main.{name}_old RENAME TO {name}")
        con.execute("COMMIT")
    finally:
        con.close()
    _pg(url, "DELETE FROM attnbase_team WHERE key = 'ledger' RETURNING key")
    _pg(url, "DELETE FROM attnbase_ledger.stat_files RETURNING run_id")
    _pg(url, "INSERT INTO attnbase_ledger.batches VALUES ('stray', 0, 0, 1, 'complete', NULL) "
             "RETURNING run_id")  # a move stopped after copying: done again from the start
    DuckLakeBackend._migrated_here.clear()
    assert pg_ledger.ensure(Database(url).catalog) is True
    assert (_rows(url, "batches"), _rows(url, "stat_files")) == before
    assert _pg(url, "SELECT count(*) FROM attnbase_ledger.batches")[0][0] == 2
    assert _pg(url, "SELECT value FROM attnbase_team WHERE key = 'ledger'") == [("postgres",)]
    assert pg_ledger.ensure(Database(url).catalog) is False  # once
    with Database(url).connect(read_only=True) as con:  # the statistics views read the files
        assert con.execute("SELECT count(*) FROM row_stats WHERE run_id = 'old'"
                           ).fetchone()[0] > 0


def _rows(url: str, table: str) -> list[tuple]:
    with Database(url).connect(read_only=True, stats=False) as con:
        return con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()


def _terminate_kept(url: str) -> int:
    """End, from the server's side, every session this process keeps idle for its catalog."""
    pids = Database(url).catalog.sessions.idle_pids()
    for p in pids:
        _pg(url, "SELECT pg_terminate_backend(%s)", [p])
    return len(pids)


def test_a_ledger_transaction_replaces_a_kept_connection_the_server_dropped(team):
    from attnbase.errors import WarehouseError

    url, _ = team
    db = Database(url)
    with db.ledger() as led:
        led.add_batches("k", [(0, 0, 2), (1, 2, 2)])
    assert _terminate_kept(url) >= 1  # the ledger's connection is kept idle, then dropped
    with db.ledger() as led:  # begins on a new connection
        led.set_status("k", [0], "complete")
    assert _pg(url, "SELECT batch FROM attnbase_ledger.batches WHERE run_id = 'k' "
                    "AND status = 'complete'") == [(0,)]
    # one lost inside the transaction: one line, nothing of it committed
    with pytest.raises(WarehouseError, match="went away during a ledger transaction") as err:
        with db.ledger() as led:
            led.set_status("k", [1], "complete")
            _pg(url, "SELECT pg_terminate_backend(%s)", [led.cur.connection.info.backend_pid])
            led.set_status("k", [0], "pending")
    assert "\n" not in str(err.value)
    assert _pg(url, "SELECT batch FROM attnbase_ledger.batches WHERE run_id = 'k' "
                    "AND status = 'complete'") == [(0,)]
