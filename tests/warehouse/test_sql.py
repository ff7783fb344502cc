from __future__ import annotations

import polars as pl
import pytest

from attnbase.errors import ReadOnlyViolationError, WarehouseError
from attnbase.warehouse import read_sql
from attnbase.warehouse.sandbox.sql import check_read_only

WRITES = {
    "INSERT": "INSERT INTO runs (run_id) VALUES ('x')",
    "UPDATE": "UPDATE runs SET status = 'failed'",
    "DELETE": "DELETE FROM row_stats",
    "CREATE": "CREATE TABLE t (a INT)",
    "DROP": "DROP TABLE runs",
    "ATTACH": "ATTACH 'other.duckdb' AS o",
    "COPY": "COPY runs TO 'out.csv'",
    "INSTALL": "INSTALL httpfs",
    "LOAD": "LOAD json",
    "SET": "SET threads = 1",
    "PRAGMA": "PRAGMA version",
    "CALL": "CALL pragma_version()",
    "EXPORT": "EXPORT DATABASE 'dump'",
    "hidden after a SELECT": "SELECT 1; DROP TABLE runs",
    "EXPLAIN ANALYZE of a write": "EXPLAIN ANALYZE DELETE FROM runs",
    "writing CTE": "WITH x AS (SELECT 1) INSERT INTO runs (run_id) SELECT 'y'",
}


@pytest.mark.parametrize("kind", list(WRITES))
def test_refuses_writes(fake_run, kind):
    db, _, _ = fake_run
    with pytest.raises(ReadOnlyViolationError) as exc:
        read_sql(db.path, WRITES[kind])
    assert "\n" not in str(exc.value) and "read-only" in str(exc.value)
    # nothing changed
    assert read_sql(db.path, "SELECT count(*) AS n FROM runs")["n"][0] == 1


@pytest.mark.parametrize("q", ["SELECT 1", "with a as (select 1 as x) select * from a",
                               "FROM runs", "DESCRIBE runs", "SHOW TABLES", "EXPLAIN SELECT 1",
                               "SUMMARIZE runs"])
def test_allows_queries(q):
    check_read_only(q)


def test_select_returns_polars(fake_run):
    db, info, cfg = fake_run
    df = read_sql(db.path, "SELECT layer, head, count(*) AS n FROM row_stats "
                           "WHERE run_id = ? GROUP BY ALL ORDER BY ALL", ["r1"])
    assert isinstance(df, pl.DataFrame)
    assert df.height == info.n_layers * info.n_heads
    assert set(df["n"].to_list()) == {cfg.n_seqs * cfg.seq_len}


def test_sql_error_is_one_line(fake_run):
    db, _, _ = fake_run
    with pytest.raises(WarehouseError) as exc:
        read_sql(db.path, "SELECT nope FROM runs")
    assert "\n" not in str(exc.value)


def test_missing_database(tmp_path):
    with pytest.raises(WarehouseError, match="no attnbase database"):
        read_sql(tmp_path / "nowhere", "SELECT 1")
    assert not (tmp_path / "nowhere").exists()
