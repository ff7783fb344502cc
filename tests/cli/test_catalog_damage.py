"""A damaged block of ``catalog.duckdb`` (issue 44, one-line list): a byte flipped inside the
block that holds ``run_metrics`` fails only the questions that read it. ``attnbase table1``
then exits 2 with one line naming the catalog file and the fix, and ``attnbase verify`` (which
reads every table of the catalog) names the damaged table instead of saying ok."""

from __future__ import annotations

import pytest


@pytest.fixture
def analysed(fake_db):
    from attnbase.stats.analyze import analyze_run

    analyze_run(fake_db, "r1", draws=5, gauss_draws=20, seed=3, n_boot=200)
    return fake_db


def flip_block_of(db, table: str) -> None:
    """Flip one byte inside a data block of ``table`` in ``db``'s catalog file."""
    import duckdb

    with duckdb.connect(str(db.catalog_path), read_only=True) as con:
        (block_size,) = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()
        (block,) = con.execute(f"SELECT min(block_id) FROM pragma_storage_info('{table}') "
                               "WHERE block_id >= 0").fetchone()
    header = 3 * 4096  # DuckDB's main header and its two database headers
    data = bytearray(db.catalog_path.read_bytes())
    data[header + block * block_size + 1000] ^= 0x55
    db.catalog_path.write_bytes(bytes(data))


@pytest.mark.slow
def test_table1_over_a_damaged_catalog_block_is_one_line(cli, analysed):
    db = analysed
    code, out, err = cli("table1", "--db", db.path)  # control: the undamaged catalog
    assert code == 0 and "r1" in out, err
    assert cli("verify", "--db", db.path)[0] == 0
    flip_block_of(db, "run_metrics")
    code, out, err = cli("table1", "--db", db.path)
    assert code == 2, (out, err)
    line = err.strip()
    assert "\n" not in line and line.startswith("error: catalog "), err
    assert str(db.catalog_path) in line and "damaged" in line and "restore" in line, line
    code, out, err = cli("verify", "--db", db.path)
    assert code == 1, (out, err)
    assert "table 'run_metrics'" in out and str(db.catalog_path) in out, out
    assert "restore" in err and not out.startswith("ok"), (out, err)
