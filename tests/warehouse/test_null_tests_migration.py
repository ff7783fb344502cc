"""Migration 10: an existing catalog's null_tests gains the docs/metrics.md §8 columns, keeps its rows."""

from __future__ import annotations

import duckdb
import pytest

from attnbase.warehouse import Database
from attnbase.warehouse.catalog import migrations as mig
from attnbase.warehouse.catalog import schema

#: head_summary as stats migration 100 created it before the rename (reads the column "null").
OLD_VIEW = """
CREATE VIEW head_summary AS
SELECT run_id, layer, head,
       max(q_value) FILTER (WHERE metric = 've_at_8' AND "null" = 'gauss') AS ve_gauss_q
FROM null_tests GROUP BY run_id, layer, head
"""


def _old_catalog(path):
    """A catalog at migrations 1 and 100 only, with two null-test rows of the old layout."""
    path.mkdir(parents=True)
    con = duckdb.connect(str(path / "catalog.duckdb"))
    try:
        con.execute(mig._LEDGER)
        schema._V1(con)
        con.execute(OLD_VIEW)
        con.executemany("INSERT INTO schema_migrations VALUES (?, ?, current_timestamp::TIMESTAMP)",
                        [(1, "core tables"), (100, "stats views")])
        con.executemany(
            "INSERT INTO null_tests VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [("r", 0, 0, "ve_at_8", "shuffle", 0.8, 0.5, 0.1, 20, 0, 1 / 21, 0.05),
             ("r", 0, 1, "ve_at_8", "gauss", 0.3, 0.3, 0.0, 200, 0, 0.5, 0.5)])
        con.executemany("INSERT INTO head_metrics VALUES ('r', 0, ?, 've_at_8', ?)",
                        [(0, 0.8), (1, 0.3)])
    finally:
        con.close()


def test_existing_catalog_is_upgraded_in_place(tmp_path):
    _old_catalog(tmp_path / "db")
    db = Database(tmp_path / "db")
    applied = [m.version for m in db.migrate()]
    assert 10 in applied and 101 in applied
    with db.connect(read_only=True) as con:
        cols = [r[0] for r in con.execute("DESCRIBE null_tests").fetchall()]
        rows = con.execute(
            "SELECT head, null_model, z, p_value, p_method, p_empirical, p_at_floor, q_value "
            "FROM null_tests ORDER BY head").fetchall()
        hs = con.execute("SELECT head, ve_gauss_q, ve_shuffle_z FROM head_summary "
                         "ORDER BY head").fetchall()
    assert cols == ["run_id", "layer", "head", "metric", "null_model", "statistic", "null_mean",
                    "null_sd", "z", "draws", "seed", "p_value", "p_method", "p_empirical",
                    "p_at_floor", "q_value"]
    # old rows: their p-value was the empirical one, and says so; z where the sd allows
    assert rows[0][:2] == (0, "shuffle") and rows[0][2] == pytest.approx(3.0)
    assert rows[0][3:] == (pytest.approx(1 / 21), "empirical", pytest.approx(1 / 21), True, 0.05)
    assert rows[1][1] == "gauss" and rows[1][2] is None and rows[1][6] is False
    # the view that read "null" is re-created on null_model (stats migration 101)
    assert hs == [(0, None, pytest.approx(3.0)), (1, 0.5, None)]


def test_fresh_catalog_has_the_new_columns_and_no_null_column(tmp_path):
    db = Database(tmp_path / "db")
    db.migrate()
    with db.connect(read_only=True) as con:
        cols = {r[0] for r in con.execute("DESCRIBE null_tests").fetchall()}
        view_cols = {r[0] for r in con.execute("DESCRIBE head_summary").fetchall()}
    assert "null" not in cols and {"null_model", "z", "p_method", "p_at_floor"} <= cols
    assert {"ve_gauss_z", "ve_shuffle_z", "ve_gauss_q", "ve_shuffle_q"} <= view_cols
