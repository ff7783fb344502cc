"""The SQL face reads the catalog and nothing else (issue 10): no files, no ATTACH, no extensions,
no SET; generated statements (hypothesis) either run as queries or are refused with one line,
and nothing in the database or around it changes."""

from __future__ import annotations

import hashlib
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbase.errors import ReadOnlyViolationError, WarehouseError
from attnbase.warehouse import read_sql
from attnbase.warehouse.sandbox.sql import SANDBOX_SETTINGS

OUTSIDE = {
    "read_csv": "SELECT * FROM read_csv('/etc/passwd', header=false)",
    "read_text": "SELECT * FROM read_text('/etc/hostname')",
    "glob": "SELECT * FROM glob('/etc/*')",
    "read_parquet": "SELECT * FROM read_parquet('/tmp/*.parquet')",
    "replacement scan of a path": "SELECT * FROM '/etc/passwd'",
    "read_csv in a CTE": "WITH x AS (SELECT * FROM read_csv('/etc/passwd')) SELECT * FROM x",
    "read_csv in a subquery": "SELECT (SELECT count(*) FROM read_text('/etc/passwd')) AS n",
    "python object": "SELECT * FROM con",
}


@pytest.mark.parametrize("kind", list(OUTSIDE))
def test_file_readers_fail_with_one_line(fake_run, kind):
    db, _, _ = fake_run
    with pytest.raises(WarehouseError) as exc:
        read_sql(db.path, OUTSIDE[kind])
    msg = str(exc.value)
    assert "\n" not in msg
    assert "root:" not in msg  # nothing of the file leaks into the message


def test_permission_error_names_the_sandbox(fake_run):
    db, _, _ = fake_run
    with pytest.raises(ReadOnlyViolationError, match="reads only the catalog.*disabled"):
        read_sql(db.path, "SELECT * FROM read_csv('/etc/passwd', header=false)")


def test_settings_are_locked_on_the_serving_connection(fake_run):
    db, _, _ = fake_run
    df = read_sql(db.path, "SELECT name, value FROM duckdb_settings() WHERE name IN "
                           "('enable_external_access', 'lock_configuration', "
                           "'autoload_known_extensions', 'python_enable_replacements')")
    got = dict(zip(df["name"], df["value"]))
    assert got == {"enable_external_access": "false", "lock_configuration": "true",
                   "autoload_known_extensions": "false", "python_enable_replacements": "false"}
    assert [n for n, _ in SANDBOX_SETTINGS][-1] == "lock_configuration"


def test_catalog_stays_readable_by_any_duckdb_client(fake_run):
    import duckdb

    db, _, _ = fake_run
    read_sql(db.path, "SELECT count(*) FROM runs")
    con = duckdb.connect(str(db.catalog_path), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (1,)
        # an ordinary client keeps its own settings: the sandbox is per connection
        assert con.execute("SELECT current_setting('enable_external_access')").fetchone() == (True,)
    finally:
        con.close()


# --- fuzzing the guard ------------------------------------------------------------------------
WRITES = [
    "INSERT INTO runs (run_id) VALUES ('x')", "UPDATE runs SET status = 'failed'",
    "DELETE FROM row_stats", "DROP TABLE runs", "CREATE TABLE t AS SELECT 1",
    "CREATE TEMP TABLE t (a INT)", "CREATE VIEW v AS SELECT 1", "ALTER TABLE runs ADD COLUMN z INT",
    "ATTACH 'other.duckdb' AS o", "DETACH o", "COPY runs TO 'out.csv'", "INSTALL httpfs",
    "LOAD httpfs", "SET threads = 1", "RESET threads", "PRAGMA version", "CALL pragma_version()",
    "EXPORT DATABASE 'dump'", "CHECKPOINT", "VACUUM", "TRUNCATE runs", "USE memory",
    "SET enable_external_access = true", "SET lock_configuration = false",
    "WITH x AS (SELECT 1) INSERT INTO runs (run_id) SELECT 'y'",
    "WITH x AS (SELECT 1) DELETE FROM runs", "EXPLAIN ANALYZE DELETE FROM runs",
    "BEGIN TRANSACTION", "CREATE MACRO m(a) AS a", "CREATE SECRET s (TYPE s3, KEY_ID 'k')",
]
READS = ["SELECT 1", "SELECT count(*) FROM runs", "FROM batches", "DESCRIBE runs",
         "WITH a AS (SELECT run_id FROM runs) SELECT * FROM a", "SELECT * FROM row_stats LIMIT 3",
         "SHOW TABLES", "EXPLAIN SELECT 1", "SUMMARIZE runs"]
COMMENTS = st.sampled_from(["", " ", "\n", "/* c */", "-- c\n", "/* SELECT 1; */", "/* ; */ ",
                            "\t", "-- DROP TABLE runs\n"])
CASE = st.sampled_from([str, str.lower, str.upper])


def _dress(stmt: str, pre: str, post: str, case) -> str:
    return f"{pre}{case(stmt)}{post}"


def _snapshot(db) -> tuple:
    """Everything a write could change: every catalog table's content and the files on disk."""
    import duckdb

    con = duckdb.connect(str(db.catalog_path), read_only=True)
    try:
        tables = [t for (t,) in con.sql("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        content = tuple((t, con.execute(f"SELECT count(*), hash(list(t ORDER BY ALL)) FROM {t} AS t")
                         .fetchone()) for t in tables)
        settings_ = con.execute("SELECT count(*) FROM duckdb_settings()").fetchone()
    finally:
        con.close()
    files = sorted(str(p.relative_to(db.path.parent)) for p in db.path.parent.rglob("*"))
    digest = hashlib.sha256(db.catalog_path.read_bytes()).hexdigest()
    return tables, content, settings_, tuple(files), digest


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stmts=st.lists(st.tuples(st.sampled_from(WRITES + READS), COMMENTS, COMMENTS, CASE),
                      min_size=1, max_size=3),
       trailing=st.sampled_from(["", ";", ";\n", "; -- end", ";;"]))
def test_generated_statements_read_or_refuse_in_one_line(fake_run, stmts, trailing):
    db, _, _ = fake_run
    before = _snapshot(db)
    query = "; ".join(_dress(s, pre, post, case) for s, pre, post, case in stmts) + trailing
    has_write = any(s in WRITES for s, *_ in stmts)
    try:
        read_sql(db.path, query)
    except WarehouseError as err:
        assert "\n" not in str(err)
    else:
        assert not has_write, f"a write ran: {query!r}"
    assert _snapshot(db) == before
    for name in ("out.csv", "other.duckdb", "dump"):  # relative to the working directory
        assert not os.path.exists(name) and not (db.path.parent / name).exists()


def test_a_passed_check_is_remembered_and_a_refusal_is_not():
    from attnbase.warehouse.sandbox import sql as wsql

    wsql._checked.cache_clear()
    ok = "select 41 + 1 as answer"
    assert wsql.check_user_sql(ok) == ok and wsql.check_user_sql(ok) == ok
    info = wsql._checked.cache_info()
    assert (info.hits, info.currsize) == (1, 1)
    for _ in range(2):  # refused each time, never remembered as passed
        with pytest.raises(ReadOnlyViolationError, match="api_tokens is not available"):
            wsql.check_user_sql("select * from api_tokens")
        with pytest.raises(WarehouseError, match="one statement per query"):
            wsql.check_user_sql("select 1; select 2")
    assert wsql._checked.cache_info().currsize == 1
    long = "select 1 as a" + " " * wsql.CHECKED_MAX_CHARS  # past the bound: checked, not kept
    assert wsql.check_user_sql(long) == long and wsql._checked.cache_info().currsize == 1
