"""Read-only SQL over the catalog: ``read_sql`` and the statement guard behind ``attnbase sql``.

Three locks:

1. every statement is classified by DuckDB's own parser first, so that statements that would act
   outside a query (ATTACH, COPY ... TO, INSTALL/LOAD, SET, PRAGMA, CALL, EXPORT) are refused
   before anything runs;
2. the connection is opened read-only (DuckDB refuses writes to the catalog);
3. the connection is opened with :data:`SANDBOX_CONFIG`, which turns off every access outside the catalog file (``enable_external_access =
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


#: DuckDB configuration of every connection that serves a user query, given at connect time so
#: that it holds from the first statement and never reaches other connections of this process
#: (DuckDB shares a database instance only between connections of one configuration).
SANDBOX_CONFIG: dict[str, object] = {
    "enable_external_access": False,  # no read_csv/read_text/glob/COPY/ATTACH of files
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "python_enable_replacements": False,  # a table name never resolves to a Python object
    "lock_configuration": True,  # no SET/RESET can undo the above
}
#: Kept for readers of the settings' names (tests, docs).
SANDBOX_SETTINGS: tuple[tuple[str, str], ...] = tuple(
    (k, str(v).lower()) for k, v in SANDBOX_CONFIG.items())


def _sql_error(err: duckdb.Error) -> WarehouseError:
    # DuckDB's message and its hints ("Candidate bindings: ...", "Did you mean ...?") form the
    # first paragraph; the query echo with its caret ("LINE 1: ...") follows a blank line
    text = str(err).strip()
    line = "; ".join(ln.strip() for ln in text.split("\n\n")[0].splitlines() if ln.strip()) \
        if text else type(err).__name__
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
    with db.connect(read_only=True, config=SANDBOX_CONFIG) as con:
        check_read_only(query, con)
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
