from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import polars as pl
import pytest

from attnbase.errors import CatalogLockedError, RunNotFoundError, WarehouseError
from attnbase.warehouse import Database, read_sql
from attnbase.warehouse.catalog import migrations as mig

CONTRACT = {
    "runs": ["run_id", "model", "model_revision", "family", "n_layers", "n_heads", "n_kv_heads",
             "d_head", "d_model", "rotary", "causal", "sink_token", "n_seqs", "seq_len", "corpus",
             "corpus_hash", "dtype", "config_hash", "status", "created_at", "finished_at",
             "attnbase_version"],
    "arrays": ["run_id", "name", "path", "dims", "shape", "chunks", "dtype"],
    "batches": ["run_id", "batch", "first_seq", "n_seqs", "status", "written_at"],
    "row_stats": ["run_id", "layer", "head", "seq", "query", "n_keys", "sink_mass", "max_prob",
                  "argmax", "entropy", "sink_balance", "content_entropy", "content_dispersion"],
    "col_stats": ["run_id", "layer", "head", "seq", "key", "received"],
    "head_metrics": ["run_id", "layer", "head", "metric", "value"],
    "null_tests": ["run_id", "layer", "head", "metric", "null_model", "statistic", "null_mean",
                   "null_sd", "z", "draws", "seed", "p_value", "p_method", "p_empirical",
                   "p_at_floor", "q_value"],
    "layer_metrics": ["run_id", "layer", "metric", "value"],
    "run_metrics": ["run_id", "metric", "value"],
    "studies": ["study_id", "kind", "run_ids", "params", "created_at"],
    "study_results": ["study_id", "key", "value"],
    "schema_migrations": ["version", "name", "applied_at"],
}


def columns(db, table):
    with db.connect(read_only=True) as con:
        return [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]


def test_constructor_creates_nothing(tmp_path):
    Database(tmp_path / "db")
    assert not (tmp_path / "db").exists()


@pytest.mark.parametrize("table", list(CONTRACT))
def test_tables_match_contract(db, table):
    db.migrate()
    cols = columns(db, table)
    assert cols[: len(CONTRACT[table])] == CONTRACT[table]


def test_migrations_idempotent_and_versioned(db):
    first = db.migrate()
    assert [m.version for m in first] == [m.version for m in mig.all_migrations()]
    with db.connect(read_only=True) as con:
        rows = con.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
    assert rows[0][0] == 1
    # re-opening (a new Database object) applies nothing and keeps the ledger
    assert Database(db.path).migrate() == []
    with Database(db.path).connect() as con:
        assert con.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == len(rows)


def test_registered_migration_applies_once(db, monkeypatch):
    db.migrate()
    calls = []

    def apply(con):
        calls.append(1)
        con.execute("CREATE VIEW v_test AS SELECT run_id FROM runs")

    monkeypatch.setattr(mig, "_REGISTERED", [mig.Migration(99, "test view", apply)])
    assert [m.version for m in Database(db.path).migrate()] == [99]
    assert Database(db.path).migrate() == []
    assert calls == [1]
    assert read_sql(db.path, "SELECT * FROM v_test").height == 0


def test_duplicate_versions_refused(monkeypatch):
    monkeypatch.setattr(mig, "_REGISTERED", [mig.Migration(1, "clash", lambda con: None)])
    with pytest.raises(WarehouseError, match="version 1"):
        mig.all_migrations()


def test_failed_migration_rolls_back(db, monkeypatch):
    db.migrate()

    def bad(con):
        con.execute("CREATE TABLE half (a INT)")
        raise RuntimeError("boom")

    monkeypatch.setattr(mig, "_REGISTERED", [mig.Migration(98, "bad", bad)])
    with pytest.raises(WarehouseError, match="migration 98"):
        Database(db.path).migrate()
    monkeypatch.setattr(mig, "_REGISTERED", [])
    tables = read_sql(db.path, "SHOW TABLES")["name"].to_list()
    assert "half" not in tables


def test_a_new_catalog_is_made_aside_and_published_whole(tmp_path, monkeypatch):
    """While a new catalog is being migrated, DIR/catalog.duckdb does not exist (so another
    process never waits on it, nor sees it half-made); a failed one publishes nothing."""
    d = tmp_path / "db"
    seen = []
    monkeypatch.setattr(mig, "_REGISTERED", [mig.Migration(
        97, "probe", lambda con: seen.append((d / "catalog.duckdb").exists()))])
    applied = Database(d).migrate()
    assert seen == [False] and 97 in [m.version for m in applied]
    assert 97 in read_sql(d, "SELECT version FROM schema_migrations")["version"].to_list()
    assert not [p.name for p in d.iterdir() if p.name.startswith(".")]  # nothing left aside

    def bad(con):
        raise RuntimeError("boom")

    monkeypatch.setattr(mig, "_REGISTERED", [mig.Migration(98, "bad", bad)])
    d2 = tmp_path / "db2"
    with pytest.raises(WarehouseError, match="migration 98"):
        Database(d2).migrate()
    assert not (d2 / "catalog.duckdb").exists()
    assert not [p.name for p in d2.iterdir() if p.name.startswith(".")]


def test_run_info_not_found(fake_run):
    db, _, _ = fake_run
    with pytest.raises(RunNotFoundError, match="known runs: r1"):
        db.run_info("nope")
    assert db.run_info("r1")["status"] == "complete"


def test_replace_rows(fake_run):
    db, _, _ = fake_run
    df = pl.DataFrame({"layer": [0, 1], "head": [0, 0], "metric": ["x", "x"], "value": [1.0, 2.0]})
    assert db.replace_rows("head_metrics", "r1", df) == 2
    assert db.replace_rows("head_metrics", "r1", df) == 2  # replaced, not appended
    got = read_sql(db.path, "SELECT * FROM head_metrics ORDER BY layer")
    assert got["run_id"].to_list() == ["r1", "r1"] and got["value"].to_list() == [1.0, 2.0]
    # a where clause limits what is deleted
    db.replace_rows("head_metrics", "r1", {"layer": np.array([5]), "head": np.array([0]),
                                           "metric": np.array(["y"]), "value": np.array([3.0])},
                    where="metric = ?", params=["y"])
    assert read_sql(db.path, "SELECT count(*) AS n FROM head_metrics")["n"][0] == 3
    with pytest.raises(WarehouseError, match="not a table"):
        db.replace_rows("runs; DROP TABLE runs", "r1", df)


HOLDER = textwrap.dedent("""
    import sys, time, duckdb
    con = duckdb.connect(sys.argv[1])
    con.execute("SELECT 1")
    print("locked", flush=True)
    sys.stdin.readline()
""")


def test_catalog_locked_by_another_process(fake_run):
    db, _, _ = fake_run
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db.catalog_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for ro in (True, False):
            with pytest.raises(CatalogLockedError) as exc:
                with db.connect(read_only=ro):
                    pass
            msg = str(exc.value)
            assert "\n" not in msg
            assert str(db.catalog_path) in msg
            assert f"PID {holder.pid}" in msg
            assert "wait for it to finish or use another --db" in msg
        with pytest.raises(CatalogLockedError):
            read_sql(Database(db.path, lock_timeout=0.1), "SELECT 1")
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
    # released: readable again
    assert read_sql(db.path, "SELECT count(*) AS n FROM runs")["n"][0] == 1


def test_delete_run(fake_run):
    db, _, _ = fake_run
    db.delete_run("r1")
    assert not db.run_dir("r1").exists()
    for t in ("runs", "arrays", "batches", "row_stats", "col_stats"):
        assert read_sql(db.path, f"SELECT count(*) AS n FROM {t}")["n"][0] == 0, t


def test_not_a_lock_io_error(tmp_path):
    d = tmp_path / "db"
    d.mkdir()
    (d / "catalog.duckdb").write_bytes(b"this is not a duckdb file" * 100)
    with pytest.raises(WarehouseError, match="cannot open catalog") as exc:
        read_sql(d, "SELECT 1")
    assert not isinstance(exc.value, CatalogLockedError)


def test_other_mode_in_this_process_waits_like_a_lock(fake_run):
    """A read-only connection held by one thread makes a writer of another thread wait (DuckDB
    refuses two configurations of one file per process), then succeed once it is closed."""
    import threading

    db, _, _ = fake_run
    opened, release = threading.Event(), threading.Event()

    def reader():
        with db.connect(read_only=True) as con:
            con.execute("SELECT 1")
            opened.set()
            release.wait(10)

    t = threading.Thread(target=reader)
    t.start()
    try:
        assert opened.wait(10)
        with pytest.raises(CatalogLockedError, match="wait for it to finish"):
            with Database(db.path, lock_timeout=0.2).connect(read_only=False):
                pass
        threading.Timer(0.05, release.set).start()
        # waits for the reader, then writes (a generous timeout: the reader thread must be
        # scheduled to close its connection, which on a loaded machine takes a while)
        with Database(db.path, lock_timeout=30).connect(read_only=False) as con:
            assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    finally:
        release.set()
        t.join(10)


def test_a_killed_makers_leftover_is_removed_by_the_next_maker(tmp_path):
    """A process killed while it made a new catalog leaves its private file; the next process
    that makes one removes it, and never a live process's."""
    d = tmp_path / "db"
    d.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = d / f".catalog.duckdb.{dead.pid}-0badc0de.new"
    live = d / f".catalog.duckdb.{os.getpid()}-0badc0de.new"  # this process: alive
    for f in (gone, live, gone.with_name(gone.name + ".wal")):
        f.write_bytes(b"x")
    Database(d).migrate()
    assert (d / "catalog.duckdb").exists()
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(".")) == [live.name]
