"""Migrations 2-3 on a catalog made by the first release: status 'interrupted' allowed, and
row_stats/col_stats rows moved from tables into per-batch Parquet files read through views."""

from __future__ import annotations

import os

import duckdb
import pytest

from attnbase.warehouse import Database, read_sql
from attnbase.warehouse.catalog import migrations as mig
from attnbase.warehouse.catalog import schema
from attnbase.warehouse.runs import statfiles


@pytest.fixture
def v1_catalog(tmp_path):
    """A catalog at schema version 1 holding one run with 2 ledger batches of row/col stats."""
    root = tmp_path / "db"
    root.mkdir()
    con = duckdb.connect(str(root / "catalog.duckdb"))
    con.execute(mig._LEDGER)
    schema.MIGRATIONS[0].apply(con)
    con.execute("INSERT INTO schema_migrations VALUES (1, 'core', now()::TIMESTAMP)")
    con.execute("INSERT INTO runs (run_id, model, family, n_layers, n_heads, n_kv_heads, d_head, "
                "d_model, rotary, causal, n_seqs, seq_len, corpus, dtype, config_hash, status, "
                "created_at, attnbase_version) VALUES ('old', 'm', 'gpt2', 1, 2, 2, 4, 8, false, "
                "true, 4, 3, 'c', 'float32', 'h', 'running', now()::TIMESTAMP, '0.1.0')")
    con.execute("INSERT INTO batches VALUES ('old', 0, 0, 2, 'complete', NULL), "
                "('old', 1, 2, 2, 'pending', NULL)")
    con.execute("INSERT INTO row_stats SELECT 'old', 0, h, s, q, q + 1, 0.5, 0.5, 0, 0.1 * q, "
                "NULL, NULL, NULL FROM range(2) a(h), range(4) b(s), range(3) c(q)")
    con.execute("INSERT INTO col_stats SELECT 'old', 0, h, s, k, 1.0 FROM range(2) a(h), "
                "range(3) b(s), range(3) c(k)")  # seq 3 has no col rows: partial batch 1
    con.close()
    return root


def test_old_catalog_migrates_to_files_with_the_same_rows(v1_catalog, tmp_path):
    before = duckdb.connect(str(v1_catalog / "catalog.duckdb"), read_only=True)
    # batch 1 (seqs 2-3) is pending: from migration 20 on, readers see ledgered batches only
    want_rows = before.execute("SELECT * FROM row_stats WHERE seq < 2 ORDER BY ALL").fetchall()
    want_cols = before.execute("SELECT * FROM col_stats WHERE seq < 2 ORDER BY ALL").fetchall()
    assert before.execute("SELECT count(*) FROM row_stats WHERE seq >= 2").fetchone()[0] > 0
    before.close()
    db = Database(v1_catalog)
    applied = {m.version for m in db.migrate()}
    assert {2, 3, 20} <= applied
    got = read_sql(db, "SELECT * FROM row_stats ORDER BY ALL").rows()
    assert [tuple(r) for r in got] == [tuple(r) for r in want_rows]
    got = read_sql(db, "SELECT * FROM col_stats ORDER BY ALL").rows()
    assert [tuple(r) for r in got] == [tuple(r) for r in want_cols]
    # one file per ledger batch, named as the writer names them (a resume replaces, never adds)
    for b in (0, 1):
        assert db.run("old").batch_file("row_stats", b).exists()
    with db.transaction() as con:
        kind = con.execute("SELECT table_type FROM information_schema.tables "
                           "WHERE table_name = 'row_stats'").fetchone()[0]
        con.execute("UPDATE runs SET status = 'interrupted' WHERE run_id = 'old'")
    assert kind == "VIEW"
    assert db.run_info("old")["status"] == "interrupted"
    assert db.migrate() == []  # applied once


def test_views_resolve_relative_to_the_database_from_any_directory(v1_catalog, tmp_path):
    """The views hold relative paths: a moved database answers, from any working directory,
    through attnbase (file_search_path = DIR) and through a plain DuckDB client that sets it."""
    Database(v1_catalog).migrate()
    moved = tmp_path / "moved"
    v1_catalog.rename(moved)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        # the complete batch's seqs 0-1 (batch 1 is pending)
        assert read_sql(moved, "SELECT count(*) AS n FROM row_stats")["n"][0] == 2 * 2 * 3
        con = duckdb.connect(str(moved / "catalog.duckdb"), read_only=True)
        con.execute(f"SET file_search_path = '{moved}'")
        assert con.execute("SELECT count(*) FROM col_stats").fetchone()[0] == 2 * 2 * 3
        con.close()
    finally:
        os.chdir(cwd)


def test_a_fresh_catalog_has_empty_views(tmp_path):
    db = Database(tmp_path / "fresh")
    db.migrate()
    assert read_sql(db, "SELECT count(*) AS n FROM row_stats")["n"][0] == 0
    cols = read_sql(db, "DESCRIBE col_stats")["column_name"].to_list()
    assert cols == ["run_id", "layer", "head", "seq", "key", "received"]
