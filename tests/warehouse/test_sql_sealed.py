"""The SQL sandbox reads the catalog's tables and the statistics files, nothing else, and shows
no path of the machine (issue 44, item 8).

DuckDB lets a connection read its own database file whatever ``allowed_directories`` says
(``read_blob('catalog.duckdb')`` answered the raw catalog's bytes, token hashes included), and
``glob`` answered absolute paths. Each hostile variant below is refused in one line (exit 2 on
the command line); the statistics files stay readable through the views and read_parquet."""

from __future__ import annotations

import pytest

HOSTILE = {
    "read_blob of the catalog": "SELECT size FROM read_blob('catalog.duckdb')",
    "read_blob through row_stats/..": "SELECT size FROM read_blob('row_stats/../catalog.duckdb')",
    "read_blob by absolute path": "SELECT size FROM read_blob('{db}/catalog.duckdb')",
    "read_blob by file:// URL": "SELECT size FROM read_blob('file://{db}/catalog.duckdb')",
    "read_text of the catalog": "SELECT content FROM read_text('{db}/row_stats/../catalog.duckdb')",
    "read_csv of the catalog": "SELECT * FROM read_csv('{db}/catalog.duckdb', "
                               "columns={{'a': 'VARCHAR'}}, delim='|', quote='', escape='')",
    "read_json of the catalog": "SELECT * FROM read_json_objects('catalog.duckdb')",
    "read_duckdb of the tokens": "SELECT * FROM read_duckdb('catalog.duckdb', "
                                 "table_name='api_tokens')",
    "glob of the statistics": "SELECT * FROM glob('row_stats/**')",
    "glob in a CTE": "WITH g AS (SELECT * FROM glob('*')) SELECT count(*) FROM g",
    "read_parquet's filename": "SELECT filename FROM read_parquet('row_stats/*/*.parquet', "
                               "filename = true)",
    "read_parquet's filename :=": "SELECT filename FROM read_parquet('row_stats/*/*.parquet', "
                                  "filename := true)",
    "parquet_metadata": "SELECT file_name FROM parquet_metadata('row_stats/*/*.parquet')",
    "a path as a table": "SELECT * FROM 'row_stats/../catalog.duckdb'",
    "explain of read_blob": "EXPLAIN SELECT * FROM read_blob('catalog.duckdb')",
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_reads_are_refused_in_one_line(fake_run, cli, kind):
    db, _, _ = fake_run
    root = db.path.resolve()
    sql = HOSTILE[kind].format(db=root)
    code, out, err = cli("sql", "--db", db.path, "--format", "csv", sql)
    assert code == 2 and out == "", (kind, out, err)
    assert err.count("\n") == 1 and err.startswith("error: attnbase sql reads only the catalog")
    assert str(root) not in err and "DUCK" not in err, err  # no path, no byte of the file


def test_a_symlink_to_the_catalog_reads_nothing_of_it(fake_run, cli):
    db, _, _ = fake_run
    link = db.path / "row_stats" / "run_id=r1" / "link.parquet"
    link.symlink_to(db.path.resolve() / "catalog.duckdb")
    code, out, err = cli("sql", "--db", db.path, "SELECT * FROM read_parquet('row_stats/run_id=r1/"
                         "link.parquet')")
    assert code == 2 and out == "" and err.count("\n") == 1, (out, err)
    assert "DUCK" not in err and "magic bytes" in err, err  # only Parquet is ever read


@pytest.mark.parametrize("sql", [
    "SELECT count(*) AS n FROM row_stats",
    "SELECT count(*) AS n FROM read_parquet('row_stats/run_id=r1/*.parquet')",
    "SELECT count(*) AS n FROM read_parquet('{db}/col_stats/run_id=r1/b000000.parquet')",
    "SELECT count(*) AS n FROM range(3) r, unnest([1, 2]) u",
    "SELECT count(*) AS n FROM duckdb_tables()",
])
def test_the_statistics_and_row_generators_still_answer(fake_run, cli, sql):
    """Negative control: the statistics files (through the views or read_parquet, relative or
    absolute) and the table functions that read no file answer."""
    db, _, _ = fake_run
    code, out, err = cli("sql", "--db", db.path, "--format", "csv",
                         sql.format(db=db.path.resolve()))
    assert code == 0 and err == "" and int(out.split()[-1]) > 0, (out, err)
