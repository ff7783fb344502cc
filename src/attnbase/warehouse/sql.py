"""Read-only SQL over the catalog: ``read_sql`` and the statement guard behind ``attnbase sql``.

Three locks:

1. every statement is classified by DuckDB's own parser first, so that statements that would act
   outside a query (ATTACH, COPY ... TO, INSTALL/LOAD, SET, PRAGMA, CALL, EXPORT) are refused
   before anything runs;
2. the connection is opened read-only (DuckDB refuses writes to the catalog);
3. :func:`sandbox` turns off every access outside the catalog file (``enable_external_access =
   false``: ``read_csv``/``read_text``/``glob``, ATTACH of a file, COPY, extension installs) and
   locks the configuration (``lock_configuration = true``) so that a query cannot ``SET`` its
   way back (DuckDB docs, "Securing DuckDB"). The catalog itself stays an ordinary DuckDB file
   that any DuckDB client can open.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import duckdb

from attnbase.errors import ReadOnlyViolationError, WarehouseError
from attnbase.warehouse.catalog import Database

_ALLOWED = {"SELECT", "EXPLAIN"}
_EXPLAIN = re.compile(r"^\s*explain(\s+analyze)?\s+", re.IGNORECASE)


def _type_name(stmt) -> str:
    return getattr(stmt.type, "name", str(stmt.type)).upper()


def _first_word(q: str) -> str:
    m = re.match(r"\s*([A-Za-z]+)", q)
    return m.group(1).upper() if m else "?"


def check_read_only(query: str, con: duckdb.DuckDBPyConnection | None = None) -> None:
    """Raise :class:`ReadOnlyViolationError` unless every statement is a query.

    Allowed: SELECT (including WITH ..., FROM ..., DESCRIBE/SHOW/SUMMARIZE) and EXPLAIN of a
    query. ``con`` is any connection (only its parser is used); a scratch one by default.
    """
    own = con is None
    con = duckdb.connect(":memory:") if own else con
    try:
        try:
            statements = con.extract_statements(query)
        except ValueError as err:  # a statement type the Python enum does not know
            raise ReadOnlyViolationError(
                f"attnbase sql is read-only: refusing a {_first_word(query)} statement ({err})"
            ) from None
        except duckdb.Error as err:
            raise WarehouseError(f"SQL error: {str(err).splitlines()[0]}") from None
    finally:
        if own:
            con.close()
    if not statements:
        raise WarehouseError("empty SQL query")
    for stmt in statements:
        kind = _type_name(stmt)
        if kind == "EXPLAIN":  # EXPLAIN ANALYZE runs its statement: check what it explains
            inner = _EXPLAIN.sub("", stmt.query, count=1)
            if inner.strip() and inner != stmt.query:
                check_read_only(inner, con if not own else None)
            continue
        if kind not in _ALLOWED:
            word = _first_word(stmt.query)
            shown = kind if word == kind else f"{kind} ({word})"
            raise ReadOnlyViolationError(
                f"attnbase sql is read-only: refusing a {shown} statement; "
                "only SELECT/WITH/EXPLAIN queries are allowed"
            )


#: Settings applied, in this order, to every connection that serves a user query. External access
#: goes first (it can only ever be switched off), the configuration lock last.
SANDBOX_SETTINGS: tuple[tuple[str, str], ...] = (
    ("enable_external_access", "false"),
    ("autoinstall_known_extensions", "false"),
    ("autoload_known_extensions", "false"),
    ("allow_community_extensions", "false"),
    # a table name must not resolve to a Python object of the calling frames
    ("python_enable_replacements", "false"),
    ("lock_configuration", "true"),
)


def sandbox(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Lock ``con`` down for untrusted SQL: no file/network access, no extension loads, no SET.

    Irreversible for the connection's lifetime; returns ``con``.
    """
    for name, value in SANDBOX_SETTINGS:
        con.execute(f"SET {name} = {value}")
    return con


def _sql_error(err: duckdb.Error) -> WarehouseError:
    line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, duckdb.PermissionException):
        return ReadOnlyViolationError(
            f"attnbase sql reads only the catalog: {line} (file readers, glob, ATTACH and "
            "extension loads are disabled; query the catalog tables)")
    return WarehouseError(f"SQL error: {line}")


def read_sql(db_dir: str | Path | Database, query: str, params: Sequence[Any] | None = None):
    """Run a read-only query against ``DIR/catalog.duckdb``; return a ``polars.DataFrame``.

    Writing statements raise :class:`ReadOnlyViolationError` before anything runs.
    """
    db = db_dir if isinstance(db_dir, Database) else Database(db_dir)
    if not db.exists():  # refuse a write before saying there is no database
        check_read_only(query)
    with db.connect(read_only=True) as con:
        check_read_only(query, con)
        sandbox(con)
        try:
            # several queries: the last one's result is returned (the others only read)
            *head, last = con.extract_statements(query)
            for stmt in head:
                con.execute(stmt)
            rel = con.sql(last.query, params=list(params) if params else None)
            if rel is None:  # EXPLAIN and friends can return no relation
                import polars as pl

                return pl.DataFrame()
            return rel.pl()
        except duckdb.Error as err:
            raise _sql_error(err) from None
