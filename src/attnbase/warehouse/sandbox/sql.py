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

import functools
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import duckdb
import pyarrow as pa

from attnbase.errors import QueryLimitError, ReadOnlyViolationError, WarehouseError
from attnbase.warehouse.database import Database
from attnbase.warehouse.sandbox.sqlerrors import sql_error as _sql_error
from attnbase.warehouse.sandbox.watchdog import run_limited

_ALLOWED = {"SELECT", "EXPLAIN"}
_EXPLAIN = re.compile(r"^\s*explain(\s+analyze)?\s+", re.IGNORECASE)


def _type_name(stmt) -> str:
    """The statement's type name; ``UNKNOWN`` for a type DuckDB's Python enum does not know
    (``UPDATE EXTENSIONS``: DuckDB 2.0 raises ``ValueError: 29 is not a valid StatementType``,
    1.5 names it ``???``)."""
    try:
        kind = stmt.type
    except ValueError:
        return "UNKNOWN"
    name = getattr(kind, "name", str(kind)).upper()
    return name if name.replace("_", "").isalpha() else "UNKNOWN"  # DuckDB 1.5: "???"


def _first_word(q: str) -> str:
    m = re.match(r"\s*([A-Za-z]+)", q)
    return m.group(1).upper() if m else "?"


_PRAGMA_AS_SELECT = re.compile(r"^SELECT \* FROM pragma_\w+\(")


def check_read_only(query: str, con: duckdb.DuckDBPyConnection | None = None) -> list:
    """Raise :class:`ReadOnlyViolationError` unless every statement is a query; return the
    parsed statements (run them: the query is parsed once).

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
        if kind == "SELECT" and _PRAGMA_AS_SELECT.match(stmt.query):
            kind = "PRAGMA"  # DuckDB 1.5 parses PRAGMA x as SELECT * FROM pragma_x()
        if kind == "EXPLAIN":  # EXPLAIN ANALYZE runs its statement: check what it explains
            inner = _EXPLAIN.sub("", stmt.query, count=1)
            if inner.strip() and inner != stmt.query:
                check_read_only(inner, con if not own else None)
            continue
        if kind not in _ALLOWED:
            word = _first_word(stmt.query)
            shown = kind if word == kind else word if kind == "UNKNOWN" else f"{kind} ({word})"
            raise ReadOnlyViolationError(
                f"attnbase sql is read-only: refusing a {shown} statement; "
                "only SELECT/WITH/EXPLAIN queries are allowed"
            )
    return statements


#: ``duckdb_*`` functions that describe the database itself (tables, views, columns, types,
#: functions): shown. Every other ``duckdb_*`` (settings, databases with their file paths,
#: secrets, temporary files, extensions, memory) describes the machine: hidden.
_SHOWN_SYSTEM = frozenset({
    "duckdb_tables", "duckdb_views", "duckdb_columns", "duckdb_types", "duckdb_functions",
    "duckdb_keywords", "duckdb_constraints", "duckdb_indexes", "duckdb_schemas",
    "duckdb_sequences"})
#: Names a user query may not mention: settings and paths of the machine, dynamic SQL (which
#: would hide a name from this check) and the catalog's internals.
_HIDDEN = frozenset({
    "current_setting", "getenv", "which_secret", "query", "query_table",
    "json_execute_serialized_sql", "databases", "__show_tables_expanded", "api_tokens",
    "pg_settings"})


#: The table functions a user query may call: the statistics files' reader (the views'
#: own, read_parquet, which DuckDB's allow-list confines to the statistics directories and
#: which reads nothing but Parquet), row generators and JSON walkers, and the descriptions of
#: the database itself. Any other is refused by name: DuckDB always lets a connection read its
#: own database file, whatever ``allowed_directories`` says (``read_blob('catalog.duckdb')``
#: read the raw catalog, token hashes included), ``glob`` and the metadata readers answer
#: absolute machine paths, and ``read_duckdb``, ``checkpoint`` or ``enable_logging`` act
#: beyond a query.
ALLOWED_TABLE_FUNCTIONS = frozenset({
    "read_parquet", "parquet_scan", "range", "generate_series", "unnest", "repeat",
    "repeat_row", "json_each", "json_tree", "pg_timezone_names", "icu_calendar_names",
}) | _SHOWN_SYSTEM
#: Options of read_parquet that put the machine's paths into the answer.
_PATH_OPTIONS = frozenset({"filename"})


def _file_access(node, out: list) -> list:
    """What a serialized statement reads beyond the catalog's tables, as one-line reasons: a
    table function outside :data:`ALLOWED_TABLE_FUNCTIONS`, a path option of one, a file
    named as a table (``FROM 'x.csv'``, DuckDB's replacement scan)."""
    if isinstance(node, dict):
        if node.get("type") == "TABLE_FUNCTION" and isinstance(node.get("function"), dict):
            fn = node["function"]
            name = str(fn.get("function_name", "")).strip('"').lower()
            if name not in ALLOWED_TABLE_FUNCTIONS:
                out.append(f"the table function {name}()")
            for arg in fn.get("arguments") or fn.get("children") or []:
                expr = arg.get("expression", arg) if isinstance(arg, dict) else {}
                # a named option: DuckDB 2's "name", 1.5's alias of the argument
                opt = (str(arg.get("name") or arg.get("alias") or "").lower()
                       if isinstance(arg, dict) else "")
                left = expr.get("left", {}) if isinstance(expr, dict) else {}
                if (opt in _PATH_OPTIONS or (expr.get("class") == "COMPARISON" and [
                        str(c).lower() for c in left.get("column_names", [])] in
                        [[o] for o in _PATH_OPTIONS])):
                    out.append(f"the {opt or left['column_names'][0]} option of {name}()")
        if node.get("type") == "BASE_TABLE" and any(
                c in str(node.get("table_name", "")) for c in "/\\.:"):
            out.append(f"the file {node['table_name']!r} named as a table")
        for value in node.values():
            if isinstance(value, (dict, list)):  # a scalar holds nothing to check
                _file_access(value, out)
    elif isinstance(node, list):
        for value in node:
            if isinstance(value, (dict, list)):
                _file_access(value, out)
    return out


def _hidden_name(name: str) -> bool:
    n = name.strip('"').lower()
    return (n in _HIDDEN or n.startswith("pragma_") or n.startswith("__ducklake")
            or (n.startswith("duckdb_") and n not in _SHOWN_SYSTEM))


_NAME_KEYS = frozenset({"function_name", "table_name", "catalog_name", "schema_name"})


def _names(node, out: set) -> set:
    """Every function and table name of a serialized statement (json_serialize_sql's tree)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _NAME_KEYS and isinstance(value, str):
                out.add(value)
            elif isinstance(value, (dict, list)):  # a scalar holds no name
                _names(value, out)
    elif isinstance(node, list):
        for value in node:
            if isinstance(value, (dict, list)):
                _names(value, out)
    return out


#: Passed checks remembered by the query's text, for texts of at most
#: :data:`CHECKED_MAX_CHARS` (at most ~4 MB in all): a dashboard or a notebook repeats its
#: questions, and a check parses the query twice (benchmarks/RESULTS.md: "SQL check remembered").
CHECKED_CACHE = 1024
CHECKED_MAX_CHARS = 4096


def check_user_sql(query: str) -> str:
    """Check a query sent by a user (``attnbase sql``, ``POST /api/sql``); return it.

    One statement, of an allowed type (:func:`check_read_only`: any other type, including
    those DuckDB's Python enum does not know, is refused), naming no function or table of
    :data:`_HIDDEN` (settings and file paths of the machine, dynamic SQL, the token table).
    Raises :class:`ReadOnlyViolationError` (403) or :class:`WarehouseError` (400). A text that
    passed is remembered (:data:`CHECKED_CACHE`); a refused one is checked again each time.
    """
    if len(query) <= CHECKED_MAX_CHARS:
        return _checked(query)
    return _check(query)


@functools.lru_cache(maxsize=CHECKED_CACHE)
def _checked(query: str) -> str:
    return _check(query)


def _check(query: str) -> str:
    import json

    con = _parser()
    statements = check_read_only(query, con)
    if len(statements) > 1:
        raise WarehouseError(f"one statement per query, got {len(statements)}; send them "
                             "one at a time")
    queries = [statements[0].query]
    if _type_name(statements[0]) == "EXPLAIN":
        queries = [_EXPLAIN.sub("", queries[0], count=1)]
    for q in queries:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?::VARCHAR)",
                                      [q]).fetchone()[0])
        if tree.get("error"):
            raise ReadOnlyViolationError(
                f"attnbase sql cannot check this query ({tree.get('error_message')}); "
                "write it as a plain SELECT")
        hidden = sorted(n.strip('"') for n in _names(tree, set()) if _hidden_name(n))
        if hidden:
            raise ReadOnlyViolationError(
                f"attnbase sql shows the database, not the machine: {', '.join(hidden)} "
                "is not available; query the catalog tables")
        files = _file_access(tree, [])
        if files:
            raise ReadOnlyViolationError(
                f"attnbase sql reads only the catalog: {files[0]} is disabled (only the "
                "statistics files may be read, and no path of the machine shown); query the "
                "catalog tables (row_stats and col_stats read the statistics files)")
    return query


_parsers = threading.local()
_parser_root: list = []
_parser_lock = threading.Lock()


def _parser():
    """This thread's cursor of one in-memory database that only parses: a cursor of an open
    database instead of a new one per check (benchmarks/RESULTS.md: "SQL parser database")."""
    cur = getattr(_parsers, "cur", None)
    if cur is None:
        with _parser_lock:
            if not _parser_root:
                _parser_root.append(duckdb.connect(":memory:"))
            cur = _parsers.cur = _parser_root[0].cursor()
    return cur


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


def _last_relation(con, statements: list, params: Sequence[Any] | None):
    """Run every statement but the last (they only read); return the last one's relation (None
    for statements such as some EXPLAINs that give none)."""
    *head, last = statements
    for stmt in head:
        con.execute(stmt)
    return con.sql(last.query, params=list(params) if params else None)


def _run_on(con, query: str, params, fetch: Callable, *, timeout_s: float | None,
            cancel: threading.Event | None):
    """On an open sandboxed connection: check, run under the watchdog, fetch."""
    statements = check_read_only(query, con)

    def work():
        try:
            return fetch(_last_relation(con, statements, params))
        except duckdb.InterruptException:
            raise
        except duckdb.Error as err:
            raise _sql_error(err) from None

    return run_limited(con, work, timeout_s=timeout_s, cancel=cancel)


def _run_query(db: Database | None, query: str, params, fetch: Callable, *,
               timeout_s: float | None, config: dict, cancel: threading.Event | None, con=None):
    if con is not None:
        return _run_on(con, query, params, fetch, timeout_s=timeout_s, cancel=cancel)
    if not db.exists():  # refuse a write before saying there is no database
        check_read_only(query)
    with db.connect(read_only=True, config=config) as own:
        return _run_on(own, query, params, fetch, timeout_s=timeout_s, cancel=cancel)


def read_sql(db_dir: str | Path | Database, query: str, params: Sequence[Any] | None = None, *,
             timeout_s: float | None = None, cancel: threading.Event | None = None):
    """Run a read-only query against ``DIR/catalog.duckdb``; return a ``polars.DataFrame``.

    Writing statements raise :class:`ReadOnlyViolationError` before anything runs. ``timeout_s``
    stops the query at that time limit (:class:`QueryLimitError`), Ctrl-C stops it at once
    (:class:`QueryInterrupted`); see :mod:`attnbase.warehouse.sandbox.watchdog`.
    """
    import polars as pl

    def fetch(rel):
        return pl.DataFrame() if rel is None else rel.pl()

    return _run_query(Database.of(db_dir), query, params, fetch, timeout_s=timeout_s,
                      config=SANDBOX_CONFIG, cancel=cancel)


@dataclass(frozen=True)
class QueryResult:
    """A bounded query result: ``table`` holds at most ``max_rows`` rows; ``truncated`` says
    whether the query had more."""

    table: pa.Table
    truncated: bool
    elapsed_ms: float


def query_arrow(db_dir: str | Path | Database | None, query: str,
                params: Sequence[Any] | None = None, *,
                timeout_s: float | None = None, max_rows: int | None = None,
                max_bytes: int | None = None, config: dict | None = None,
                cancel: threading.Event | None = None, con=None) -> QueryResult:
    """A read-only query's result as Arrow, within limits: ``timeout_s`` (the watchdog),
    ``max_rows`` (the rest is cut, ``truncated=True``), ``max_bytes`` of Arrow data (more raises
    :class:`QueryLimitError`). ``config`` is the connections' DuckDB configuration: it must hold
    :data:`SANDBOX_CONFIG` (the service adds its memory/thread limits). ``con``: an open
    connection of that configuration to run on (several queries of one page share one), else
    one is opened for this query (``db_dir`` is not read when ``con`` is given)."""
    conf = dict(SANDBOX_CONFIG if config is None else config)
    if any(conf.get(k) != v for k, v in SANDBOX_CONFIG.items()):
        raise WarehouseError("query_arrow's config must contain SANDBOX_CONFIG")
    t0 = time.perf_counter()

    def fetch(rel):
        if rel is None:
            return pa.table({}), False
        reader = rel.to_arrow_reader(8192)
        batches, rows, nbytes = [], 0, 0
        try:
            for batch in reader:
                if max_rows is not None and rows + batch.num_rows > max_rows:
                    batches.append(batch.slice(0, max_rows - rows))
                    return pa.Table.from_batches(batches, schema=reader.schema), True
                rows += batch.num_rows
                nbytes += batch.nbytes
                if max_bytes is not None and nbytes > max_bytes:
                    raise QueryLimitError(
                        f"result exceeds the byte cap of {max_bytes} bytes ({rows} rows so far); "
                        "narrow the query (WHERE, fewer columns) or export it with `attnbase sql`")
                batches.append(batch)
            return pa.Table.from_batches(batches, schema=reader.schema), False
        finally:
            # a reader left unfinished keeps DuckDB 1.5's database instance: the next connect
            # to the same file would wait for it forever
            reader.close()

    db = None if con is not None else Database.of(db_dir)
    table, truncated = _run_query(db, query, params, fetch, timeout_s=timeout_s, config=conf,
                                  cancel=cancel, con=con)
    return QueryResult(table, truncated, (time.perf_counter() - t0) * 1000)


def user_query(db: Database, query: str, limits, *, file: str | Path | None = None,
               config: dict | None = None, params: Sequence[Any] | None = None,
               cancel: threading.Event | None = None, pool=None,
               damaged: dict[str, str] | None = None):
    """A query a user sent, checked (:func:`check_user_sql`) and run in a query process
    within ``limits`` (:class:`~attnbase.warehouse.sandbox.sqlproc.Limits`): the time, memory, row and
    byte limits hold whatever the query does (:mod:`attnbase.warehouse.sandbox.sqlproc`). ``file``: a
    snapshot of ``DIR/catalog.duckdb`` to read instead, against the directory ``db.path``;
    ``pool``: a :class:`~attnbase.warehouse.sandbox.sqlproc.QueryPool` (else one process for
    this query);
    ``damaged``: statistics files (relative path -> one-line message) the views leave out,
    failing their runs' questions. Returns a :class:`~attnbase.warehouse.sandbox.sqlproc.UserResult`."""
    from attnbase.warehouse.sandbox.sqlproc import QueryProcess

    check_user_sql(query)
    conf = dict(SANDBOX_CONFIG if config is None else config)
    if any(conf.get(k) != v for k, v in SANDBOX_CONFIG.items()):
        raise WarehouseError("user_query's config must contain SANDBOX_CONFIG")
    from attnbase.warehouse.database import location

    where = location(db) if file is None else str(db.path.resolve())
    kwargs = dict(db=where, file=None if file is None else str(file),
                  config=conf, limits=limits, params=list(params) if params else None,
                  cancel=cancel, damaged=damaged)
    if pool is not None:
        result = pool.run(query, **kwargs)
    else:
        proc = QueryProcess(db.require().path)
        try:
            result = proc.run(query, **kwargs)
        finally:
            proc.kill()
    if result.cut_by == "bytes" and result.table.num_rows == 0:
        raise QueryLimitError(f"the result's first row exceeds the byte cap of {limits.max_bytes} "
                              "bytes; select fewer or shorter columns")
    return result
